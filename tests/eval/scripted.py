"""A deterministic chat endpoint for evaluation tests (no model): it answers from the prompt.

critic: sufficient once the evidence holds "Tulsa" or "Somerset", else asks for "Arkansas River
Oklahoma"; reader: the first of a few known answers found in the evidence, else "unknown";
table classifier: lookup. Pickled by value so Ray workers need not import ``tests``.
"""

import json

from canopy_ray.models.llm.protocol import ChatResult

ANSWERS = ("Somerset", "Tulsa", "Arkansas River")


class ScriptedClient:
    model = "scripted"

    def __init__(self):
        self.calls = 0

    def _reply(self, messages, response_format):
        role = response_format["json_schema"]["name"].removeprefix("canopy_")
        text = messages[-1]["content"] if isinstance(messages[-1]["content"], str) else ""
        evidence = text.rsplit("\n\nQuestion:", 1)[0]
        self.calls += 1
        if role == "critic":
            ok = "Tulsa" in evidence or "Somerset" in evidence
            return json.dumps({"sufficient": ok, "missing": "" if ok else "the river",
                               "next_query": "" if ok else "Arkansas River Oklahoma"})
        if role == "reader":
            found = next((a for a in ANSWERS if a in evidence), "unknown")
            return json.dumps({"answer": found})
        return json.dumps({"kind": "lookup"})

    def chat(self, messages, *, response_format=None, max_tokens=None):
        return ChatResult(self._reply(messages, response_format), "stop", 10, 5, self.model)

    async def achat(self, messages, *, response_format=None, max_tokens=None):
        return self.chat(messages, response_format=response_format, max_tokens=max_tokens)


def scripted_factory(cfg):
    return ScriptedClient()
