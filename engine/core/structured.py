"""What a constrained request's output must match: one ``StructuredSpec`` in its sampling
params. Torch-free and backend-free (``engine.structured`` compiles it).

Kinds, as the OpenAI and vLLM request fields name them:

- ``json_schema``: ``source`` is the schema's JSON text (``response_format`` json_schema,
  vLLM's ``guided_json``);
- ``json_object``: any JSON object (``response_format`` json_object); ``source`` is empty;
- ``regex``: a regular expression (``guided_regex``);
- ``choice``: ``source`` is the JSON list of the allowed strings (``guided_choice``);
- ``grammar``: a Lark grammar (``guided_grammar``; the gateway's tool-call format too).

``prefix`` is output the request already produced elsewhere (a request migrated from a worker
that died resumes with its delivered tokens appended to the prompt): the matcher consumes
those tokens first. It is not part of ``key``: the compiled grammar is the same.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredSpec:
    kind: str
    source: str = ""
    prefix: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {KINDS}, got {self.kind!r}")
        object.__setattr__(self, "prefix", tuple(int(t) for t in self.prefix))

    @property
    def key(self) -> str:
        """The compiled-grammar cache key: a hash of the kind and the source."""
        digest = hashlib.sha256(f"{self.kind}\x00{self.source}".encode()).hexdigest()
        return digest[:32]
