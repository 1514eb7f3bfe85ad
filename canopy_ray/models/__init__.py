"""Encoders and LLM clients: the heavy parts behind small interfaces."""
