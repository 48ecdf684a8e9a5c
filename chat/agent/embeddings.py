"""Text embeddings (plugins' llm.embed) through the models of `[llm] embedding`: each call admitted under
the budgets (the purpose's task, the model's caps), recorded in the ledger (chat.LLMCall, prompt tokens
only) and charged, a provider error trying the next model, as chat completions do (chat.agent.llm)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from chat.agent import budget, llm
from core.config import get_config

MAX_TEXTS = 256  # texts one call embeds
MAX_CHARS = 200_000  # characters of all of them together


@dataclass
class EmbedResult:
    vectors: list[list[float]] = field(default_factory=list)  # one per text, in order
    model_name: str = ""
    error: str = ""


def embed_sync(*, purpose: str, texts: list[str]) -> EmbedResult:
    """The embeddings of `texts` from the first embedding model that answers (sync: call it from a
    worker thread). A budget refusal or no configured model is an error result, never an exception."""
    if not texts or len(texts) > MAX_TEXTS or sum(len(t) for t in texts) > MAX_CHARS:
        return EmbedResult(error=f"1 to {MAX_TEXTS} texts, {MAX_CHARS} characters in all")
    cfg = get_config()
    models = cfg.llm_models()
    route = [models[name] for name in cfg.llm.embedding if name in models]
    if not route:
        return EmbedResult(error="no embedding model is configured ([llm] embedding)")
    task, errors = budget.task_of(purpose), []
    for attempt, model in enumerate(route):
        admission = llm._admit(cfg, task, model, None)
        if not admission.admitted:
            errors.append(admission.reason(cfg.tzinfo))
            continue
        result = llm.LLMResult(model_name=model.name)
        started, vectors = time.perf_counter(), []
        try:
            with llm._sync_gate(model):
                client = llm.get_sync_client(cfg, model)
                response = client.embeddings.create(model=model.model, input=texts, timeout=model.timeout)
            vectors = [list(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
            result.prompt_tokens = int(getattr(response.usage, "prompt_tokens", 0) or 0)
            if len(vectors) != len(texts):
                result.error = f"the model answered {len(vectors)} embeddings for {len(texts)} texts"
        except llm._call_errors() as exc:
            llm._failed(exc, result, model.timeout)
        llm._finish(result, started, purpose, model.model)
        llm._record(purpose=purpose, model=model, attempt=attempt, result=result, session_id=None, cycle_id=None,
                    admission=admission)  # fmt: skip
        if not result.error:
            return EmbedResult(vectors=vectors, model_name=model.name)
        errors.append(f"{model.name}: {result.error}")
    return EmbedResult(error="; ".join(errors)[:1000])
