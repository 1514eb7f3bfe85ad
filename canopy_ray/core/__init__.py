"""The pure CANOPY core: no Ray, no torch. Every other layer calls into it."""
