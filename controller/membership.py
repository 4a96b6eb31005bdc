"""Elastic by whole nodes: which nodes form a multi-node gang's next incarnation. Pure.

On a verified restart command every agent stops its ranks and announces itself ready for
the next incarnation (an `schemas.events.AgentReady` on the controller topic); it then
waits up to its ``--node-timeout`` for the other nodes' announcements. A node whose agent
is gone (killed with its ranks, the host lost) never announces. From the nodes it heard
from, each agent decides alone, with the same rules, so every survivor that heard the
same set decides the same. The rules, in order:

1. Every node of the ending incarnation is ready: **full**, the same nodes.
2. ``--min-nnodes`` equals the gang's node count (the default): **fail** ("... forbids
   shrinking"); the run may not run on fewer nodes than it was launched on.
3. The run's backend declared nothing (no RunStarted with ``backend`` seen, an older
   trainer): **fail**; a controller never reshards a checkpoint on a guess.
4. The backend does not declare ``reshardable_checkpoint``: **fail** (a checkpoint of N
   ranks would not load on fewer).
5. The backend does not declare ``elastic_restart``: **fail**.
6. Fewer nodes ready than ``--min-nnodes``: **fail**.
7. Otherwise: **shrink** to the ready nodes, renumbered in their old order (node ``k`` of
   the next incarnation is the ``k``-th ready node), so global ranks stay node-major and
   the world size is ``len(nodes) x nproc_per_node``.

A failed decision names the missing nodes and the rule that forbade shrinking, in one
line: the agents publish it as RestartFailed and end the run (RunEnded ``failed``).
Waiting for a lost node without bound is not an option here: the agent whose node is
gone has no one to bring it back, and a run that only waits would hold its surviving
nodes idle until the process-group timeout, then fail anyway.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from schemas.events import BackendDeclaration

NodeVerdict = Literal["full", "shrink", "fail"]


@dataclass(frozen=True)
class NodeDecision:
    """Which nodes start the next incarnation.

    Attributes:
        verdict: ``full`` (all nodes), ``shrink`` (the ready ones) or ``fail``.
        nodes: The node ranks (of the ending incarnation) that start the next one, in
            order: the next incarnation's node ``k`` is ``nodes[k]``; empty for ``fail``.
        reason: One line; empty for ``full``.
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


def _names(nodes: Collection[int]) -> str:
    listed = sorted(nodes)
    word = "node" if len(listed) == 1 else "nodes"
    return f"{word} {', '.join(str(n) for n in listed)}"


def decide_nodes(
    nnodes: int,
    ready: Collection[int],
    *,
    min_nnodes: int,
    backend: BackendDeclaration | None,
    timeout_s: float,
) -> NodeDecision:
    """Decide the next incarnation's nodes from the agents that announced themselves.

    Args:
        nnodes: Nodes of the ending incarnation.
        ready: Node ranks (of the ending incarnation) whose agents announced themselves
            ready within the timeout, this node included; others are ignored.
        min_nnodes: ``--min-nnodes``: the gang never runs on fewer nodes.
        backend: What the run's backend declared in its RunStarted; None: nothing.
        timeout_s: How long the agents waited (for the reason's text).

    Returns:
        The decision; see the module doc for the rules.
    """
    present = tuple(sorted({n for n in ready if 0 <= n < nnodes}))
    missing = sorted(set(range(nnodes)) - set(present))
    if not missing:  # rule 1
        return NodeDecision("full", present)
    lost = f"{_names(missing)} of {nnodes} lost (no agent ready within {timeout_s:g}s)"
    if min_nnodes >= nnodes:  # rule 2
        return NodeDecision(
            "fail",
            reason=f"{lost}; --min-nnodes {min_nnodes} (default: --nnodes) forbids shrinking",
        )
    if backend is None:  # rule 3
        return NodeDecision(
            "fail",
            reason=f"{lost}; the run's backend declared no capabilities (RunStarted.backend), "
            f"so it is not shrunk",
        )
    if not backend.reshardable_checkpoint:  # rule 4
        return NodeDecision(
            "fail",
            reason=f"{lost}; backend {backend.name} does not declare reshardable_checkpoint",
        )
    if not backend.elastic_restart:  # rule 5
        return NodeDecision(
            "fail", reason=f"{lost}; backend {backend.name} does not declare elastic_restart"
        )
    if len(present) < min_nnodes:  # rule 6
        return NodeDecision(
            "fail",
            reason=f"{lost}; {len(present)} left, below --min-nnodes {min_nnodes}",
        )
    return NodeDecision(  # rule 7
        "shrink",
        present,
        f"{lost}: {nnodes} -> {len(present)} nodes ({_names(present)}, renumbered from 0), "
        f"backend {backend.name}",
    )


__all__ = ["NodeDecision", "NodeVerdict", "decide_nodes"]
