"""Treatment policies over the binary anchor-action subset (paper §IV-A a) "Reference policy family for OPE").

The paper evaluates four target policies on a binary subset ``{a_off, a_on}`` of the action vocabulary, the two
actions with the strongest logged support (:func:`anchor_actions`): Never (T_t ≡ a_off), Always (T_t ≡ a_on),
Early-on and Late-on. Policies are declarative TOML files in the top-level ``policies/`` folder (see its README);
each file is one :class:`Policy` with a ``rule`` table:

- ``kind = "constant"``: ``on = true|false`` at every step;
- ``kind = "window"``: on for ``start <= t < stop``; with ``unit = "fraction"`` the bounds are fractions of each
  trajectory's valid length (Early-on: ``[0, 0.5)``, i.e. ``t < length/2``; Late-on: ``[0.5, 1]``), with
  ``unit = "step"`` they are step indices (a switch at step k is ``start = k``);
- ``kind = "threshold"``: on when the mean of the last ``lookback`` simulated/observed outcomes (the last columns
  of the history passed in, most recent last) is ``below`` (or ``above``) ``value``; ``initial`` decides the steps
  with no history yet.

Runtime contract (other layers code against it): :class:`PolicyLike`, the one protocol of a target policy
(``name``, ``actions(t, y_hist, lengths, a_off, a_on) -> int64 [B]``, ``prob(...) -> float64 [B]``), which
:class:`Policy` implements; ``load_policy``, ``load_policies``, ``default_policies``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal, Protocol, Union, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fcd_secure.data.paths import policy_dir
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DataError, field_path

POLICY_DIR = policy_dir()
DEFAULT_POLICY_NAMES = ("never", "always", "early_on", "late_on")


@runtime_checkable
class PolicyLike(Protocol):
    """A target policy over the anchor subset, as simulators, the DKT-Synth ground truth and OPE estimators use it.

    Rollouts (a simulator's do-simulation, :meth:`DKTSynthWorld.true_policy_value`) call :meth:`actions`;
    importance-weighting estimators call :meth:`prob`. :class:`Policy` implements it; a policy written in Python
    (e.g. a learned one) needs the same three members.
    """

    name: str

    def actions(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int) -> np.ndarray:
        """The action at step ``t`` for each of B rows, int64 [B], given the outcomes before ``t`` (``y_hist`` [B, h])
        and each row's valid length (``lengths`` [B])."""
        ...

    def prob(
        self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int, logged: np.ndarray
    ) -> np.ndarray:
        """π(logged action | history) for each of B rows, float64 [B]."""
        ...


class ConstantRule(BaseModel):
    """On (a_on) or off (a_off) at every step."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["constant"]
    on: bool


class WindowRule(BaseModel):
    """On for ``start <= t < stop`` (fractions of each trajectory's length, or step indices)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["window"]
    unit: Literal["fraction", "step"] = "fraction"
    start: float = Field(default=0.0, ge=0.0)
    #: exclusive; omit for "until the end"
    stop: float | None = None

    @model_validator(mode="after")
    def _order(self) -> "WindowRule":
        if self.stop is not None and self.stop <= self.start:
            raise ValueError(f"stop ({self.stop}) must be greater than start ({self.start})")
        if self.unit == "fraction" and (self.start > 1.0 or (self.stop is not None and self.stop > 1.0)):
            raise ValueError("with unit = 'fraction', start and stop must lie in [0, 1]")
        return self


class ThresholdRule(BaseModel):
    """On when the recent outcome mean crosses a threshold (a feedback policy on simulated outcomes)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["threshold"]
    value: float
    when: Literal["below", "above"] = "below"
    lookback: int = Field(default=1, ge=1)
    #: decision at steps with no outcome history yet (t = 0)
    initial: bool = False


Rule = Annotated[Union[ConstantRule, WindowRule, ThresholdRule], Field(discriminator="kind")]


class Policy(BaseModel):
    """A deterministic policy over the binary anchor subset {a_off, a_on}."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    rule: Rule

    def on(self, t: int, y_hist: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Whether the policy takes a_on at step ``t``: bool [B].

        ``y_hist`` is [B, h]: the outcomes (simulated or observed) of the steps *before* ``t``, oldest first and the
        most recent (step t−1) last. It may be the whole history (h = t) or only its recent part (h < t, e.g. a
        rollout that started at some ``start_t`` and carries only what it simulated): the threshold rule reads its
        last ``lookback`` columns, never absolute step indices. ``lengths`` [B] is the valid length of each
        trajectory (steps at or beyond it are padding; the value there is defined but irrelevant).
        """
        lengths = np.asarray(lengths)
        B = lengths.shape[0]
        r = self.rule
        if isinstance(r, ConstantRule):
            return np.full(B, r.on, dtype=bool)
        if isinstance(r, WindowRule):
            lo, hi = (r.start * lengths, (np.inf if r.stop is None else r.stop * lengths)) if r.unit == "fraction" \
                else (np.full(B, r.start), np.full(B, np.inf if r.stop is None else r.stop))
            return (t >= lo) & (t < hi)
        y_hist = np.asarray(y_hist, dtype=np.float64).reshape(B, -1)
        if t == 0 or y_hist.shape[1] == 0:
            return np.full(B, r.initial, dtype=bool)
        # the last `lookback` columns, not y_hist[:, t-lookback:t]: a history shorter than t (a rollout from start_t)
        # would make that slice empty, its mean NaN and the rule silently "off"
        recent = y_hist[:, -r.lookback:].mean(axis=1)
        return recent < r.value if r.when == "below" else recent > r.value

    def actions(self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int) -> np.ndarray:
        """The action id at step ``t`` for each of B trajectories: int64 [B] (a_on where :meth:`on`, else a_off)."""
        return np.where(self.on(t, y_hist, lengths), np.int64(a_on), np.int64(a_off)).astype(np.int64)

    def prob(
        self, t: int, y_hist: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int, logged: np.ndarray
    ) -> np.ndarray:
        """π(logged action | history): 1.0 where the logged action equals the policy's, else 0.0 (float64 [B])."""
        return (self.actions(t, y_hist, lengths, a_off, a_on) == np.asarray(logged)).astype(np.float64)

    def plan(self, Y: np.ndarray, lengths: np.ndarray, a_off: int, a_on: int) -> np.ndarray:
        """Actions for every step given a full outcome matrix ``Y`` [B, L] (history at t = ``Y[:, :t]``): int64 [B, L]."""
        Y = np.asarray(Y)
        return np.stack([self.actions(t, Y[:, :t], lengths, a_off, a_on) for t in range(Y.shape[1])], axis=1)


def anchor_actions(ds: SiteDataset | list[SiteDataset]) -> tuple[int, int]:
    """(a_off, a_on): the two actions with the most logged valid steps (paper §IV-A a).

    a_off is the most supported action, a_on the second (labels are nominal, as in the paper); ties go to the smaller
    id. A list of sites is pooled (in a deployment this is one action histogram per site, summed).

    Args:
        ds: One dataset or a list of sites (the training sites).

    Returns:
        ``(a_off, a_on)``.

    Raises:
        DataError: No dataset, or fewer than two actions are logged.
    """
    sets = ds if isinstance(ds, list) else [ds]
    if not sets:
        raise DataError("anchor_actions: no datasets")
    n_actions = max(d.n_actions for d in sets)
    counts = np.zeros(n_actions, dtype=np.int64)
    for d in sets:
        counts += np.bincount(d.T[d.M > 0], minlength=n_actions)[:n_actions]
    order = np.argsort(-counts, kind="stable")
    if counts[order[1]] == 0:
        raise DataError(f"{sets[0].name}: fewer than two actions are logged; no binary anchor subset exists")
    return int(order[0]), int(order[1])


def load_policy(path: str | Path) -> Policy:
    """Read one policy TOML file (format in ``policies/README.md``).

    Raises:
        DataError: The file is missing, does not parse or does not validate; the message names the file and the
            bad field (e.g. ``rule.start``).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("policy file not found", file=path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"does not parse as TOML: {exc}", file=path) from None
    try:
        return Policy.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        # drop the union tag pydantic inserts (rule.window.start -> rule.start) so the field reads like the file
        loc = tuple(p for i, p in enumerate(first["loc"]) if not (i == 1 and first["loc"][0] == "rule"
                                                                  and p in ("constant", "window", "threshold")))
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise DataError(f"{first['msg']}{more}", file=path, field=field_path(loc)) from None


def load_policies(folder: str | Path) -> list[Policy]:
    """Every ``*.toml`` policy in ``folder``, sorted by file name.

    Raises:
        DataError: The folder is missing, a file is invalid, or two files share a policy name.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError("policy folder not found", file=folder)
    out = [load_policy(p) for p in sorted(folder.glob("*.toml"))]
    seen: dict[str, int] = {}
    for p in out:
        seen[p.name] = seen.get(p.name, 0) + 1
        if seen[p.name] > 1:
            raise DataError(f"two policy files are named '{p.name}'", file=folder, field="name")
    return out


def default_policies() -> list[Policy]:
    """The paper's four policies, in order never, always, early_on, late_on, read from the top-level policies/."""
    return [load_policy(POLICY_DIR / f"{name}.toml") for name in DEFAULT_POLICY_NAMES]
