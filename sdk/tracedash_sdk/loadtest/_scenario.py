"""What each request asks for: one chat request shape, or a weighted mix from a scenario file.

Scenario file (JSON, or TOML on Python 3.11+), see docs/loadtest.md::

    {"qps": 20, "duration": 60,
     "scenarios": [
       {"name": "short chat", "weight": 3, "models": ["sim-gpt"], "turns": 1,
        "prompt_chars": 200, "max_tokens": 40},
       {"name": "long conversation", "weight": 1, "models": ["sim-gpt", "sim-large"], "turns": 8,
        "prompt_chars": 600, "max_tokens": 300, "system": "You are a careful assistant."}]}

Each arrival picks a scenario by weight, then one of its models (uniformly, or by ``model_weights``),
and sends one chat request whose ``messages`` hold a conversation of ``turns`` user turns (with the
assistant's earlier answers between them) of about ``prompt_chars`` characters each.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import random
from typing import Any, Dict, List, Optional

_WORDS = ("latency token model request answer context trace batch queue cache prompt stream chunk "
          "service network memory compute budget window metric result value question system user").split()

SCENARIO_KEYS = {"name", "weight", "model", "models", "model_weights", "turns", "prompt_chars", "max_tokens",
                 "system", "stream"}
FILE_KEYS = {"qps", "duration", "scenarios", "scenario"}


class ScenarioError(ValueError):
    """A scenario file or value is wrong; the message names the file and the field."""


def _text(rng: random.Random, chars: int) -> str:
    words: List[str] = []
    n = 0
    while n < chars:
        w = rng.choice(_WORDS)
        words.append(w)
        n += len(w) + 1
    return " ".join(words)[:max(chars, 1)]


class Scenario:
    """One kind of request in the mix."""

    def __init__(self, name: str, *, weight: float = 1.0, models: List[str], model_weights: Optional[List[float]] = None,
                 turns: int = 1, prompt_chars: int = 200, max_tokens: int = 20, system: Optional[str] = None,
                 stream: bool = True):
        where = f"scenario {name!r}"
        if not name or not isinstance(name, str):
            raise ScenarioError("every scenario needs a non-empty string 'name'")
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
            raise ScenarioError(f"{where}: 'weight' must be a number > 0")
        if not models or not all(isinstance(m, str) and m for m in models):
            raise ScenarioError(f"{where}: 'models' must be a non-empty list of model names")
        if model_weights is not None and (len(model_weights) != len(models)
                                          or not all(isinstance(w, (int, float)) and w > 0 for w in model_weights)):
            raise ScenarioError(f"{where}: 'model_weights' must give one number > 0 per model")
        for key, value, low in (("turns", turns, 1), ("prompt_chars", prompt_chars, 1), ("max_tokens", max_tokens, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ScenarioError(f"{where}: '{key}' must be an integer >= {low}")
        if system is not None and not isinstance(system, str):
            raise ScenarioError(f"{where}: 'system' must be a string")
        if not isinstance(stream, bool):
            raise ScenarioError(f"{where}: 'stream' must be true or false")
        self.name, self.weight, self.models = name, float(weight), list(models)
        self.model_weights = list(model_weights) if model_weights else None
        self.turns, self.prompt_chars, self.max_tokens = turns, prompt_chars, max_tokens
        self.system, self.stream = system, stream
        rng = random.Random(name)
        # A fixed conversation per scenario; each request gets its own number in the last turn so that
        # no two prompts are identical (servers with prompt caches would otherwise see one prompt).
        self._messages: List[Dict[str, str]] = []
        if system:
            self._messages.append({"role": "system", "content": system})
        for turn in range(turns):
            self._messages.append({"role": "user", "content": _text(rng, prompt_chars)})
            if turn < turns - 1:
                self._messages.append({"role": "assistant", "content": _text(rng, prompt_chars // 2 or 1)})

    def body(self, model: str, n: int) -> bytes:
        messages = list(self._messages)
        last = messages[-1]
        messages[-1] = {"role": "user", "content": f"[{n}] " + last["content"]}
        payload: Dict[str, Any] = {"model": model, "messages": messages, "max_tokens": self.max_tokens,
                                   "stream": self.stream}
        if self.stream:
            payload["stream_options"] = {"include_usage": True}
        return json.dumps(payload, separators=(",", ":")).encode()

    def to_dict(self) -> dict:
        out = {"name": self.name, "weight": self.weight, "models": self.models, "turns": self.turns,
               "prompt_chars": self.prompt_chars, "max_tokens": self.max_tokens, "stream": self.stream}
        if self.model_weights:
            out["model_weights"] = self.model_weights
        if self.system:
            out["system"] = self.system
        return out


class RequestMix:
    """Picks the scenario and model of each arrival (seeded, so a run can be repeated)."""

    def __init__(self, scenarios: List[Scenario], seed: Optional[int] = None):
        if not scenarios:
            raise ScenarioError("at least one scenario is needed")
        names = [s.name for s in scenarios]
        if len(set(names)) != len(names):
            raise ScenarioError("scenario names must be unique")
        self.scenarios = scenarios
        self._cum = list(itertools.accumulate(s.weight for s in scenarios))
        self._rng = random.Random(seed)
        self._n = 0

    @classmethod
    def single(cls, *, model: str, max_tokens: int = 20, prompt_chars: int = 200, stream: bool = True) -> "RequestMix":
        return cls([Scenario("chat", models=[model], max_tokens=max_tokens, prompt_chars=prompt_chars, stream=stream)])

    def next(self):
        """(scenario, model, body bytes) of the next request."""
        self._n += 1
        rng = self._rng
        if len(self.scenarios) == 1:
            scenario = self.scenarios[0]
        else:
            scenario = self.scenarios[bisect.bisect_right(self._cum, rng.random() * self._cum[-1])]
        if len(scenario.models) == 1:
            model = scenario.models[0]
        elif scenario.model_weights:
            model = rng.choices(scenario.models, weights=scenario.model_weights)[0]
        else:
            model = rng.choice(scenario.models)
        return scenario, model, scenario.body(model, self._n)

    @property
    def models(self) -> List[str]:
        return list(dict.fromkeys(m for s in self.scenarios for m in s.models))

    def to_list(self) -> List[dict]:
        return [s.to_dict() for s in self.scenarios]


def load_scenario_file(path: str, *, default_model: Optional[str] = None) -> dict:
    """Read a scenario file: ``{"qps": float|None, "duration": float|None, "mix": RequestMix}``."""
    if not os.path.isfile(path):
        raise ScenarioError(f"{path}: no such file")
    try:
        if path.endswith(".toml"):
            try:
                import tomllib  # Python 3.11+
            except ImportError:  # pragma: no cover - older Pythons
                raise ScenarioError(f"{path}: TOML needs Python 3.11+; use a JSON scenario file") from None
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        else:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
    except ScenarioError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parse error is reported with the path
        raise ScenarioError(f"{path}: cannot parse: {exc}") from None
    return scenarios_from_dict(data, where=path, default_model=default_model)


def scenarios_from_dict(data: Any, *, where: str = "scenario", default_model: Optional[str] = None) -> dict:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: expected an object with 'scenarios'")
    unknown = set(data) - FILE_KEYS
    if unknown:
        raise ScenarioError(f"{where}: unknown keys {', '.join(sorted(unknown))} (known: {', '.join(sorted(FILE_KEYS))})")
    items = data.get("scenarios", data.get("scenario"))
    if not isinstance(items, list) or not items:
        raise ScenarioError(f"{where}: 'scenarios' must be a non-empty list")
    scenarios = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ScenarioError(f"{where}: scenarios[{i}] must be an object")
        unknown = set(item) - SCENARIO_KEYS
        if unknown:
            raise ScenarioError(f"{where}: scenarios[{i}]: unknown keys {', '.join(sorted(unknown))}")
        values = dict(item)
        models = values.pop("models", None)
        model = values.pop("model", None)
        if models is None:
            models = [model] if model else ([default_model] if default_model else None)
        if models is None:
            raise ScenarioError(f"{where}: scenarios[{i}] needs 'model' or 'models'")
        if not isinstance(models, list):
            raise ScenarioError(f"{where}: scenarios[{i}]: 'models' must be a list")
        name = values.pop("name", None)
        try:
            scenarios.append(Scenario(name, models=models, **values))
        except ScenarioError as exc:
            raise ScenarioError(f"{where}: scenarios[{i}]: {exc}") from None
        except TypeError as exc:
            raise ScenarioError(f"{where}: scenarios[{i}]: {exc}") from None
    out: Dict[str, Any] = {"mix": RequestMix(scenarios)}
    for key in ("qps", "duration"):
        value = data.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0):
            raise ScenarioError(f"{where}: '{key}' must be a number > 0")
        out[key] = value
    return out
