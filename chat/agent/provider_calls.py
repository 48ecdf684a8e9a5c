"""Calls to a provider's other endpoints, for plugins: text embeddings (`[llm] embedding`, llm.embed) and
speech to text (`[llm] voice`, llm.transcribe_audio). As chat completions (chat.agent.llm): each call is
admitted under the budgets (the purpose's task, the model's caps), recorded in the ledger (chat.LLMCall;
embeddings count prompt tokens, transcriptions none) and charged; a provider error tries the next model
of the route."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chat.agent import budget, llm
from core.config import LLMModel, get_config

MAX_TEXTS = 256  # texts one call embeds
MAX_CHARS = 200_000  # characters of all of them together
MAX_AUDIO_BYTES = 10 * 1024 * 1024


@dataclass
class ProviderResult:
    vectors: list[list[float]] = field(default_factory=list)  # embeddings: one per text, in order
    text: str = ""  # a transcription
    model_name: str = ""
    error: str = ""


def _over_route(purpose: str, names: list[str], what: str, ask: Callable[[Any, LLMModel, llm.LLMResult], Any]):
    """`ask(client, model, ledger_result)` on each model of the route in turn until one answers; its
    return value and the model's name, or (None, why none answered)."""
    cfg = get_config()
    models = cfg.llm_models()
    route = [models[name] for name in names if name in models]
    if not route:
        return None, f"no {what} model is configured ([llm] {what})"
    task, errors = budget.task_of(purpose), []
    for attempt, model in enumerate(route):
        admission = llm._admit(cfg, task, model, None)
        if not admission.admitted:
            errors.append(admission.reason(cfg.tzinfo))
            continue
        result, answer, started = llm.LLMResult(model_name=model.name), None, time.perf_counter()
        try:
            with llm._sync_gate(model):
                answer = ask(llm.get_sync_client(cfg, model), model, result)
        except llm._call_errors() as exc:
            llm._failed(exc, result, model.timeout)
        llm._finish(result, started, purpose, model.model)
        llm._record(purpose=purpose, model=model, attempt=attempt, result=result, session_id=None, cycle_id=None,
                    admission=admission)  # fmt: skip
        if not result.error:
            return answer, model.name
        errors.append(f"{model.name}: {result.error}")
    return None, "; ".join(errors)[:1000]


def embed_sync(*, purpose: str, texts: list[str]) -> ProviderResult:
    """The embeddings of `texts` from the first embedding model that answers (sync: call it from a
    worker thread). A budget refusal or no configured model is an error result, never an exception."""
    if not texts or len(texts) > MAX_TEXTS or sum(len(t) for t in texts) > MAX_CHARS:
        return ProviderResult(error=f"1 to {MAX_TEXTS} texts, {MAX_CHARS} characters in all")

    def ask(client, model: LLMModel, result: llm.LLMResult) -> list[list[float]]:
        response = client.embeddings.create(model=model.model, input=texts, timeout=model.timeout)
        vectors = [list(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
        result.prompt_tokens = int(getattr(response.usage, "prompt_tokens", 0) or 0)
        if len(vectors) != len(texts):
            result.error = f"the model answered {len(vectors)} embeddings for {len(texts)} texts"
        return vectors

    vectors, named = _over_route(purpose, get_config().llm.embedding, "embedding", ask)
    return ProviderResult(vectors=vectors, model_name=named) if vectors is not None else ProviderResult(error=named)


def transcribe_sync(*, purpose: str, audio: bytes, filename: str) -> ProviderResult:
    """The text of `audio` from the first speech-to-text model that answers (sync, as embed_sync)."""
    if not audio or len(audio) > MAX_AUDIO_BYTES:
        return ProviderResult(error=f"the audio must be 1 byte to {MAX_AUDIO_BYTES} bytes")

    def ask(client, model: LLMModel, result: llm.LLMResult) -> str:
        response = client.audio.transcriptions.create(model=model.model, file=(filename, audio), timeout=model.timeout)
        return str(getattr(response, "text", "") or "")

    text, named = _over_route(purpose, get_config().llm.voice, "voice", ask)
    return ProviderResult(text=text, model_name=named) if text is not None else ProviderResult(error=named)
