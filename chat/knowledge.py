"""The knowledge store's search (plugins' knowledge.search): BM25 over the enabled KnowledgeEntry rows,
with Latin words and Chinese character bigrams as terms (so "天气预报" finds "明天的天气" by 天气
without a word segmenter). The index is built in this process and rebuilt when the store changes (its
row count or newest edit); at most MAX_ENTRIES entries are indexed, the most recently edited."""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from dataclasses import dataclass

from chat.models import KnowledgeEntry

MAX_ENTRIES = 5_000
K1, B = 1.5, 0.75
_LATIN = re.compile(r"[a-z0-9]+")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")


def terms(text: str) -> list[str]:
    """Search terms of `text`: lowercase Latin words and digits; each run of Chinese characters as its
    bigrams (a lone character as itself)."""
    text = text.lower()
    found = _LATIN.findall(text)
    for run in _CJK.findall(text):
        found.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
    return found


@dataclass(frozen=True)
class Hit:
    title: str
    content: str
    score: float


@dataclass
class _Index:
    version: tuple
    entries: list[tuple[str, str]]  # (title, content)
    counts: list[Counter]
    lengths: list[int]
    document_frequency: Counter


_lock = threading.Lock()
_index: _Index | None = None


def _current() -> _Index:
    global _index
    rows = KnowledgeEntry.objects.filter(enabled=True)
    newest = rows.order_by("-updated_at").values_list("updated_at", flat=True).first()
    version = (rows.count(), newest)
    with _lock:
        if _index is not None and _index.version == version:
            return _index
    entries = list(rows.order_by("-updated_at").values_list("title", "content")[:MAX_ENTRIES])
    counts = [Counter(terms(f"{title}\n{content}")) for title, content in entries]
    frequency: Counter = Counter()
    for count in counts:
        frequency.update(count.keys())
    built = _Index(version, entries, counts, [sum(c.values()) for c in counts], frequency)
    with _lock:
        _index = built
    return built


def knowledge_search(query: str, limit: int = 5) -> list[Hit]:
    """The entries that best match `query` (BM25), best first, at most `limit`; none without a shared
    term. Sync (reads the database): call it from a worker thread in async code."""
    index = _current()
    wanted = set(terms(query))
    if not wanted or not index.entries:
        return []
    n = len(index.entries)
    average = sum(index.lengths) / n or 1.0
    hits = []
    for (title, content), count, length in zip(index.entries, index.counts, index.lengths, strict=True):
        score = 0.0
        for term in wanted & count.keys():
            df = index.document_frequency[term]
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = count[term]
            score += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / average))
        if score > 0:
            hits.append(Hit(title, content, score))
    hits.sort(key=lambda h: -h.score)
    return hits[:limit]
