"""Elastic by whole nodes: which nodes form a multi-node gang's next incarnation. Pure.

On a verified restart command every agent stops its ranks and announces itself ready for
the next incarnation (an `schemas.events.AgentReady` on the controller topic); it then
waits up to its ``--node-timeout`` for the other nodes' announcements. A node whose agent
is gone (killed with its ranks, the host lost) never announces. A node whose agent is alive
may still keep failing (a bad GPU, a flaky NIC): every agent charges each restart to the
node of the rank the command's verdict names (`charge_failure`), reading the same verdict
from the log, so every agent keeps the same per-node counts without talking. From the nodes
it heard from and the counts, each agent decides alone, with the same rules, so every
survivor that heard the same set decides the same.

Charging a restart (`charge_failure`), in order:

1. No verdict found for the command (none at its ``source``, or not the one it names):
   **nobody** is charged.
2. The verdict is not a node fault (only ``dead_rank`` and ``hang`` are; a NaN loss or a
   divergence is the model's, not a node's): **nobody**.
3. The verdict names no rank (a whole gang silent): **nobody**.
4. Some node of the gang did not announce itself: **nobody** (the survivors' ranks failed
   on the lost node, and the verdict names one of them; the lost node is dropped anyway).
5. Otherwise: the node of the named rank (``rank // nproc_per_node``) gets one failure.

Deciding the next incarnation's nodes (`decide_nodes`). A node is *lost* when it did not
announce itself, *failing* when it announced itself but caused more failures than the
``--node-failure-budget``; both are to be dropped. The rules, in order:

1. No node lost and none failing: **full**, the same nodes.
2. ``--min-nnodes`` equals the gang's node count (the default): the run may not run on
   fewer nodes than it was launched on.
3. The run's backend declared nothing (no RunStarted with ``backend`` seen, an older
   trainer): a controller never reshards a checkpoint on a guess.
4. The backend does not declare ``reshardable_checkpoint`` (a checkpoint of N ranks would
   not load on fewer).
5. The backend does not declare ``elastic_restart``.
6. Fewer nodes left than ``--min-nnodes`` once the lost and failing ones are dropped.
7. Otherwise: **shrink** to the nodes left, renumbered in their old order (node ``k`` of
   the next incarnation is the ``k``-th node left), so global ranks stay node-major and
   the world size is ``len(nodes) x nproc_per_node``.

Rules 2 to 6 forbid dropping nodes: with a node lost the decision is **fail** (it cannot
come back); with only failing nodes it is **full** (they are alive: the gang restarts at
its size, and the reason says why the failing node was kept), as a one-node gang whose
rank exceeds ``--rank-failure-budget`` keeps its size when ``--min-nproc`` forbids less.
Failing nodes are dropped all together or not at all.

A failed decision names the missing nodes and the rule that forbade shrinking, in one
line: the agents publish it as RestartFailed and end the run (RunEnded ``failed``).
Waiting for a lost node without bound is not an option here: the agent whose node is
gone has no one to bring it back, and a run that only waits would hold its surviving
nodes idle until the process-group timeout, then fail anyway. A dropped node's own agent
reaches the same decision, sees itself left out, and exits without restarting its ranks.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from runwatch.schemas.events import (
    AnomalyDetected,
    AnomalyKind,
    BackendDeclaration,
    RestartRequested,
)

NodeVerdict = Literal["full", "shrink", "fail"]

NODE_FAULT_KINDS: Final[frozenset[AnomalyKind]] = frozenset({"dead_rank", "hang"})
"""Verdicts that charge a failure to the node of the rank they name."""


@dataclass(frozen=True)
class NodeDecision:
    """Which nodes start the next incarnation.

    Attributes:
        verdict: ``full`` (all nodes), ``shrink`` (the ones left) or ``fail``.
        nodes: The node ranks (of the ending incarnation) that start the next one, in
            order: the next incarnation's node ``k`` is ``nodes[k]``; empty for ``fail``.
        reason: One line; empty for a plain ``full`` (a ``full`` that keeps a failing node
            says why it was kept).
    """

    verdict: NodeVerdict
    nodes: tuple[int, ...] = ()
    reason: str = ""

    def new_rank(self, node_rank: int) -> int:
        """This node's rank in the next incarnation.

        Raises:
            ValueError: The node is not in the next incarnation.
        """
        return self.nodes.index(node_rank)

    def counts(self, failures: Sequence[int]) -> tuple[int, ...]:
        """The per-node failure counts renumbered for the next incarnation's nodes.

        A node dropped takes its count with it; a node kept keeps its count (the same
        machine under its new number). Empty for ``fail``.
        """
        return tuple(failures[n] if n < len(failures) else 0 for n in self.nodes)


def _names(nodes: Collection[int]) -> str:
    listed = sorted(nodes)
    word = "node" if len(listed) == 1 else "nodes"
    return f"{word} {', '.join(str(n) for n in listed)}"


def charge_failure(
    failures: Sequence[int],
    *,
    nnodes: int,
    nproc_per_node: int,
    command: RestartRequested,
    verdict: AnomalyDetected | None,
    ready: Collection[int],
) -> tuple[int, ...]:
    """Per-node failure counts after the restart ``command`` is charged.

    Args:
        failures: Counts so far, by node of the ending incarnation (shorter is padded).
        nnodes: Nodes of the ending incarnation.
        nproc_per_node: Ranks per node (global rank ``r`` is on node ``r // nproc_per_node``).
        command: The restart command being executed.
        verdict: The record at the command's ``source`` (the verdict it names), None when
            it could not be read.
        ready: The nodes whose agents announced themselves for the next incarnation.

    Returns:
        One count per node; see the module doc for the charging rules.
    """
    counts = [*failures[:nnodes], *[0] * max(0, nnodes - len(failures))]
    if verdict is None or verdict.verdict_id != command.cause_verdict_id:  # rule 1
        return tuple(counts)
    if verdict.kind not in NODE_FAULT_KINDS:  # rule 2
        return tuple(counts)
    if verdict.rank is None:  # rule 3
        return tuple(counts)
    if set(range(nnodes)) - set(ready):  # rule 4
        return tuple(counts)
    node = verdict.rank // max(1, nproc_per_node)  # rule 5
    if 0 <= node < nnodes:
        counts[node] += 1
    return tuple(counts)


def decide_nodes(
    nnodes: int,
    ready: Collection[int],
    *,
    min_nnodes: int,
    backend: BackendDeclaration | None,
    timeout_s: float,
    failures: Sequence[int] = (),
    failure_budget: int | None = None,
) -> NodeDecision:
    """Decide the next incarnation's nodes from the agents that announced themselves.

    Args:
        nnodes: Nodes of the ending incarnation.
        ready: Node ranks (of the ending incarnation) whose agents announced themselves
            ready within the timeout, this node included; others are ignored.
        min_nnodes: ``--min-nnodes``: the gang never runs on fewer nodes.
        backend: What the run's backend declared in its RunStarted; None: nothing.
        timeout_s: How long the agents waited (for the reason's text).
        failures: Failures charged per node (`charge_failure`), this restart's included.
        failure_budget: ``--node-failure-budget``: a node may cause this many failures;
            one more and it is to be dropped. None: no node is ever dropped for failing.

    Returns:
        The decision; see the module doc for the rules.
    """
    present = tuple(sorted({n for n in ready if 0 <= n < nnodes}))
    missing = sorted(set(range(nnodes)) - set(present))
    failing = [
        n
        for n in present
        if failure_budget is not None and n < len(failures) and failures[n] > failure_budget
    ]
    if not missing and not failing:  # rule 1
        return NodeDecision("full", present)
    why = []
    if missing:
        why.append(f"{_names(missing)} of {nnodes} lost (no agent ready within {timeout_s:g}s)")
    if failing:
        times = ", ".join(f"{failures[n]}" for n in failing)
        why.append(
            f"{_names(failing)} of {nnodes} failed {times} times (--node-failure-budget "
            f"{failure_budget})"
        )
    dropped = "; ".join(why)
    left = tuple(n for n in present if n not in failing)

    def forbidden(rule: str) -> NodeDecision:
        """Rules 2-6: a lost node fails the run; failing nodes alone are kept."""
        if missing:
            return NodeDecision("fail", reason=f"{dropped}; {rule}")
        return NodeDecision("full", present, f"{dropped}; kept: {rule}")

    if min_nnodes >= nnodes:  # rule 2
        return forbidden(f"--min-nnodes {min_nnodes} (default: --nnodes) forbids shrinking")
    if backend is None:  # rule 3
        return forbidden(
            "the run's backend declared no capabilities (RunStarted.backend), so it is not shrunk"
        )
    if not backend.reshardable_checkpoint:  # rule 4
        return forbidden(f"backend {backend.name} does not declare reshardable_checkpoint")
    if not backend.elastic_restart:  # rule 5
        return forbidden(f"backend {backend.name} does not declare elastic_restart")
    if len(left) < min_nnodes:  # rule 6
        return forbidden(f"{len(left)} left, below --min-nnodes {min_nnodes}")
    return NodeDecision(  # rule 7
        "shrink",
        left,
        f"{dropped}: {nnodes} -> {len(left)} nodes ({_names(left)}, renumbered from 0), "
        f"backend {backend.name}",
    )


__all__ = ["NODE_FAULT_KINDS", "NodeDecision", "NodeVerdict", "charge_failure", "decide_nodes"]
