"""The request model of ``POST /v1/ask`` (strict: unknown keys and wrong types are refused) and the message that
tells a client what to send."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from bapsql.serve.registry import NAME_PATTERN

MAX_QUESTION_CHARS = 2000
MAX_BODY_BYTES = 16_384

EXPECTED = {"db": "NAME (a registered database, see GET /v1/databases; never a path)",
            "question": f"TEXT (1..{MAX_QUESTION_CHARS} characters)",
            "budget": "XS | S | M | L (optional; the server's default when left out)"}


class AskRequest(BaseModel):
    """One question about one registered database under one budget level."""

    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"examples": [{"db": "shop", "question": "How many orders are there?",
                                                               "budget": "S"}]})

    db: str = Field(pattern=NAME_PATTERN, max_length=64,
                    description="Name of a registered database (the stem of a --db file), see GET /v1/databases.")
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="The question, in plain words.")
    budget: str | None = Field(default=None, max_length=16,
                               description="Budget level: XS, S, M or L (default: the server's --budget).")
