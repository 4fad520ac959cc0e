"""Per-trace figures, defined once (DOMAIN.md "Per trace"): the trace page, the explorer, the
rollups and the alerts all compute them here, so the same number means the same thing everywhere.

Input: the spans of one trace as mappings with the keys of ``SPAN_FIELDS_SQL`` (times in integer
nanoseconds). Pure Python, no Django or store import; linear-logarithmic in the span count, so a
10,000-span trace is summarised in milliseconds.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PHASES = ("network", "preprocess", "inference", "postprocess", "other")
# Where spans of different phases run in parallel (siblings), an instant is attributed to one phase
# only, so phase times never add up to more than E2E; the model call wins, then the network.
_PRIORITY = {"inference": 5, "network": 4, "preprocess": 3, "postprocess": 2, "other": 1}

# The columns a caller selects from ``spans`` to feed these functions (deduplicate per span_id).
SPAN_FIELDS_SQL = """span_id, parent_span_id, name, phase, phase_fallback, cache, service, model,
    toUnixTimestamp64Nano(start_time) AS start_ns, duration_ns, status, status_message,
    ttft_ns, input_tokens, output_tokens, cost_usd"""

Span = Mapping[str, object]


def _start(span: Span) -> int:
    return int(span["start_ns"])


def _end(span: Span) -> int:
    return int(span["start_ns"]) + int(span["duration_ns"])


def phase_of(span: Span) -> str:
    """The phase the span was stored with (unknown or empty: ``other``)."""
    phase = span.get("phase") or "other"
    return phase if phase in _PRIORITY else "other"


# A span whose phase came from the fallback rules (``phase_fallback``: it stated none) and that lies
# beneath a model call is part of that call and counts as inference; the link is followed through
# at most this many such spans (the SQL summary's pointer jumping covers 2 ** 10 steps).
INHERIT_DEPTH = 1024


def dedupe(spans: Iterable[Span]) -> list[Span]:
    """One span per span_id (the last one seen wins: a re-sent span replaces its earlier copy)."""
    by_id: dict[str, Span] = {}
    for span in spans:
        by_id[str(span["span_id"])] = span
    return list(by_id.values())


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _subtract(start: int, end: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) minus a sorted, merged list of intervals."""
    out, cursor = [], start
    for c_start, c_end in covered:
        if c_end <= cursor:
            continue
        if c_start >= end:
            break
        if c_start > cursor:
            out.append((cursor, c_start))
        cursor = max(cursor, c_end)
        if cursor >= end:
            break
    if cursor < end:
        out.append((cursor, end))
    return out


@dataclass
class Tree:
    """Parent/child structure of one trace. ``roots``: spans without a parent (the real root first);
    ``orphans``: spans whose parent id is set but not in the trace (shown and marked, never dropped)."""

    spans: dict[str, Span]
    children: dict[str, list[str]]
    root: str | None
    orphans: list[str]

    @classmethod
    def build(cls, spans: Iterable[Span]) -> "Tree":
        by_id = {str(s["span_id"]): s for s in dedupe(spans)}
        children: dict[str, list[str]] = defaultdict(list)
        roots, orphans = [], []
        for span_id, span in by_id.items():
            parent = span.get("parent_span_id") or ""
            if not parent:
                roots.append(span_id)
            elif parent in by_id and parent != span_id:
                children[parent].append(span_id)
            else:
                orphans.append(span_id)
        for kids in children.values():
            kids.sort(key=lambda s: (_start(by_id[s]), s))
        roots.sort(key=lambda s: (-int(by_id[s]["duration_ns"]), _start(by_id[s]), s))
        orphans.sort(key=lambda s: (_start(by_id[s]), s))
        return cls(spans=by_id, children=dict(children), root=roots[0] if roots else None, orphans=orphans)

    def extent(self) -> tuple[int, int]:
        """The root's interval, or (no root yet) the interval the spans cover."""
        if self.root is not None:
            root = self.spans[self.root]
            return _start(root), _end(root)
        if not self.spans:
            return 0, 0
        return min(map(_start, self.spans.values())), max(map(_end, self.spans.values()))

    @functools.cached_property
    def phases(self) -> dict[str, str]:
        """Each span's phase in the figures (``phases_effective``), computed once per tree."""
        return phases_effective(self)

    def self_intervals(self, span_id: str) -> list[tuple[int, int]]:
        """The span's own time: its interval minus what its children cover (clipped to it)."""
        span = self.spans[span_id]
        start, end = _start(span), _end(span)
        kids = [(max(start, _start(self.spans[c])), min(end, _end(self.spans[c]))) for c in self.children.get(span_id, ())]
        return _subtract(start, end, _merge(kids))


def phases_effective(tree: Tree) -> dict[str, str]:
    """Each span's phase in the figures: its own, except that a span whose phase came from the
    fallback rules counts as ``inference`` when the chain of such spans above it ends at a model call
    (an inference span), within ``INHERIT_DEPTH`` steps: the HTTP request beneath an LLM span is the
    model call's time, not network time."""
    # span -> (phase of the first span up the chain that is not a fallback one, steps to it)
    reached: dict[str, tuple[str | None, int]] = {}
    for start in tree.spans:
        path: list[str] = []
        on_path: set[str] = set()
        current = start
        while current not in reached:
            span = tree.spans[current]
            parent = str(span.get("parent_span_id") or "")
            if not span.get("phase_fallback") or parent not in tree.spans or parent == current:
                reached[current] = (phase_of(span), 0)
                break
            if current in on_path:  # a cycle of fallback spans: no model call above them
                for node in path:
                    reached[node] = (None, 0)
                break
            path.append(current)
            on_path.add(current)
            current = parent
        for node, above in zip(reversed(path), reversed(path[1:] + [current])):
            if node not in reached:
                phase, steps = reached[above]
                reached[node] = (phase, steps + 1)
    out = {}
    for span_id, span in tree.spans.items():
        phase, steps = reached[span_id]
        out[span_id] = "inference" if phase == "inference" and 1 <= steps <= INHERIT_DEPTH else phase_of(span)
    return out


def self_times(spans: Iterable[Span]) -> dict[str, int]:
    """Self (exclusive) time of every span in ns: its duration minus the union of its children."""
    tree = Tree.build(spans)
    return {span_id: sum(e - s for s, e in tree.self_intervals(span_id)) for span_id in tree.spans}


def phase_times(spans: Iterable[Span], tree: Tree | None = None) -> dict[str, int]:
    """Exclusive wall time per phase in ns (DOMAIN.md), within the root's interval.

    Each span contributes its self intervals to its phase; a phase's intervals count once (union);
    an instant covered by self time of several phases (parallel siblings, orphans) goes to the
    highest-priority phase (the root's own time ranks last). The root's own uncovered time counts as the root's phase, ``other``
    unless the root declares one. The sum never exceeds E2E.
    """
    tree = tree or Tree.build(spans)
    lo, hi = tree.extent()
    phases = tree.phases
    events: list[tuple[int, int, int]] = []  # (time, +1/-1, priority)
    for span_id in tree.spans:
        # A root's own time ranks below every other span's self time: an orphan (its parent never
        # arrived) lies inside some unknown child of the root, so it takes the time it covers.
        priority = _PRIORITY[phases[span_id]] + (0 if span_id == tree.root else 5)
        for start, end in tree.self_intervals(span_id):
            start, end = max(start, lo), min(end, hi)
            if end > start:
                events.append((start, 1, priority))
                events.append((end, -1, priority))
    events.sort()
    totals = dict.fromkeys(PHASES, 0)
    by_priority = {p + bonus: name for name, p in _PRIORITY.items() for bonus in (0, 5)}
    active = [0] * 11
    previous = None
    for time_ns, delta, priority in events:
        if previous is not None and time_ns > previous:
            top = next((p for p in range(10, 0, -1) if active[p] > 0), 0)
            if top:
                totals[by_priority[top]] += time_ns - previous
        active[priority] += delta
        previous = time_ns
    return totals


def critical_path(spans: Iterable[Span], tree: Tree | None = None) -> list[tuple[str, int, int]]:
    """The segments ``(span_id, start_ns, end_ns)`` that determine the trace's end-to-end time.

    From the root's end walk back: among the children that finish before the cursor, the last to
    finish owns the time up to its end (recursively), and the cursor moves to its start; time no
    such child covers belongs to the parent. A child that overruns its parent (clock skew) is first
    clipped to it. This is Jaeger's definition: a child still running when the next one on the
    path started was not what that one waited for.
    """
    tree = tree or Tree.build(spans)
    if tree.root is None:
        return []
    segments: list[tuple[str, int, int]] = []

    def walk(span_id: str, window: tuple[int, int]) -> None:
        stack = [(span_id, window)]  # iterative: a 10,000-span chain must not hit the recursion limit
        while stack:
            current, (lo, hi) = stack.pop()
            span = tree.spans[current]
            start, end = max(lo, _start(span)), min(hi, _end(span))  # clipped to its parent
            cursor = end
            kids = []
            for kid in tree.children.get(current, ()):
                k_start, k_end = max(start, _start(tree.spans[kid])), min(end, _end(tree.spans[kid]))
                if k_end > k_start:
                    kids.append((k_end, k_start, kid))
            kids.sort(reverse=True)
            for k_end, k_start, kid in kids:
                if k_end > cursor or cursor <= start:
                    continue
                if k_end < cursor:
                    segments.append((current, k_end, cursor))
                stack.append((kid, (k_start, k_end)))
                cursor = k_start
            if cursor > start:
                segments.append((current, start, cursor))

    walk(tree.root, tree.extent())
    segments.sort(key=lambda seg: (seg[1], seg[2]))
    return segments


@dataclass
class TraceSummary:
    start_ns: int
    e2e_ns: int  # the root span's duration; without a root, the extent of the spans present
    has_root: bool
    root_name: str
    service: str
    model: str  # the first model call's
    status: str  # the request's outcome (DOMAIN.md "Status"): "ok" | "recovered" | "error"
    error_message: str  # the first error's message (the root's, when the root failed)
    ttft_ns: int | None  # the first model call's (that reports one)
    tpot_ns: float | None  # (call duration - TTFT) / (output tokens - 1), streamed calls, >= 2 tokens
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    cost_estimated: bool  # some of the cost came from the price table
    span_count: int
    phase_ns: dict[str, int] = field(default_factory=dict)
    error_spans: int = 0  # spans with status error ("spans with errors": its own figure)
    # per model of the spans: (input tokens, output tokens, cost USD); "" for spans without a model
    by_model: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    # The request's cache outcome (DOMAIN.md "Cache"): 2 when a cache answered any of its spans, 1 when
    # a span consulted a cache and none hit, 0 when none consulted one (``spans.cache``' highest).
    cache: int = 0
    # Whether any span reported a token count (the sums above are then 0 for "unknown"); a figure
    # for display only, so it takes no part in comparisons.
    tokens_reported: bool = field(default=True, compare=False)

    def phase_share(self, phase: str) -> float | None:
        return self.phase_ns.get(phase, 0) / self.e2e_ns if self.e2e_ns > 0 else None


def span_cost(span: Span, prices: Mapping[str, tuple[float, float]] | None) -> tuple[float | None, bool]:
    """A span's cost: the sent ``cost_usd``, else tokens × the model's price per million tokens
    (input, output) from ``prices``; the flag says the figure is an estimate."""
    cost = span.get("cost_usd")
    if cost is not None:
        return float(cost), False
    tokens_in, tokens_out = int(span.get("input_tokens") or 0), int(span.get("output_tokens") or 0)
    price = (prices or {}).get(str(span.get("model") or ""))
    if price is None or not (tokens_in or tokens_out):
        return None, False
    return (tokens_in * price[0] + tokens_out * price[1]) / 1_000_000, True


STATUSES = ("ok", "recovered", "error")


def request_status(root: Span | None, error_spans: int) -> str:
    """The request's outcome (DOMAIN.md "Status"): its root span's status; without a root (not
    arrived yet), an error if any span is one. A request whose root succeeded although a span
    below it failed (a retried model call) is ``recovered``: not an error request."""
    if root is None:
        return "error" if error_spans else "ok"
    if root.get("status") == "error":
        return "error"
    return "recovered" if error_spans else "ok"


def trace_summarize(spans: Iterable[Span], *, prices: Mapping[str, tuple[float, float]] | None = None,
                    tree: Tree | None = None) -> TraceSummary:
    """Every per-trace figure of DOMAIN.md for one trace's spans."""
    tree = tree or Tree.build(spans)
    all_spans = sorted(tree.spans.values(), key=lambda s: (_start(s), str(s["span_id"])))
    lo, hi = tree.extent()
    root = tree.spans[tree.root] if tree.root is not None else (all_spans[0] if all_spans else {})
    calls = [s for s in all_spans if phase_of(s) == "inference"]
    token_spans = calls if any(int(s.get("input_tokens") or 0) or int(s.get("output_tokens") or 0) for s in calls) else all_spans
    first_call = next((s for s in calls if s.get("ttft_ns") is not None), None)
    ttft = int(first_call["ttft_ns"]) if first_call is not None else None
    tpot = None
    if first_call is not None and int(first_call.get("output_tokens") or 0) >= 2:
        tpot = max(0, int(first_call["duration_ns"]) - ttft) / (int(first_call["output_tokens"]) - 1)
    cost_total, any_cost, estimated = 0.0, False, False
    # Each call is priced and attributed to its own model (a trace calling two models charges
    # each its share), as its tokens are: the costs page's spend and tokens per model.
    by_model: dict[str, list] = {}
    for span in all_spans:
        cost, is_estimate = span_cost(span, prices)
        if cost is not None:
            cost_total += cost
            any_cost = True
            estimated = estimated or is_estimate
            by_model.setdefault(str(span.get("model") or ""), [0, 0, 0.0])[2] += cost
    for span in token_spans:
        tokens_in, tokens_out = int(span.get("input_tokens") or 0), int(span.get("output_tokens") or 0)
        if tokens_in or tokens_out:
            entry = by_model.setdefault(str(span.get("model") or ""), [0, 0, 0.0])
            entry[0] += tokens_in
            entry[1] += tokens_out
    errors = [s for s in all_spans if s.get("status") == "error"]
    root_span = tree.spans[tree.root] if tree.root is not None else None
    model_span = calls[0] if calls else next((s for s in all_spans if s.get("model")), None)
    return TraceSummary(
        start_ns=lo,
        e2e_ns=hi - lo,
        has_root=tree.root is not None,
        root_name=str(root.get("name", "")),
        service=str(root.get("service", "")),
        model=str(model_span.get("model") or "") if model_span is not None else "",
        status=request_status(root_span, len(errors)),
        error_message=str(errors[0].get("status_message") or "") if errors else "",
        ttft_ns=ttft,
        tpot_ns=tpot,
        input_tokens=sum(int(s.get("input_tokens") or 0) for s in token_spans),
        output_tokens=sum(int(s.get("output_tokens") or 0) for s in token_spans),
        cost_usd=cost_total if any_cost else None,
        cost_estimated=estimated,
        span_count=len(all_spans),
        phase_ns=phase_times((), tree=tree),
        error_spans=len(errors),
        by_model={m: (v[0], v[1], v[2]) for m, v in sorted(by_model.items())},
        cache=max((int(s.get("cache") or 0) for s in all_spans), default=0),
        tokens_reported=any(s.get("input_tokens") is not None or s.get("output_tokens") is not None
                            for s in token_spans),
    )
