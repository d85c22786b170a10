"""Wait-for cycles: the blocked waits of one supervisor and the search for cycles among them.

No trio here. The driver (``_waits``) registers each wait made inside an attempt
(``Wait``: its caller waits for a target) and tells this module what the other nodes
wait for (``state_edges``: slot edges, joiners, permit edges). Nodes
are the driver's task records, compared by identity; an edge carries a label (how the
one waits for the other) for the driver's message.

The wait-for graph: a node with registered waits is a *blocked caller*, and its edges
are its waits' edges (``wait_edges``: none once a wait is satisfied, or while the caller
is stopping, which ends its waits by its grace deadline at the latest); any other node's
edges are its ``state_edges``. Two questions are answered:

* ``closing_cycle(wait)``: does the new ``wait`` close a cycle (can its target reach its
  caller)? The cycle, starting with the caller, in wait-for order. Given the wait's
  edges, it searches from those: the driver asks so for a caller whose stop was
  requested (its waits have no edges), to find a wait that can end only once the caller
  has (a self-wait).
* ``cycle_through(node)``: ``node`` has just gained edges (work taken in behind a slot,
  work that reached its permit wait, permit edges that appeared); is it now on a cycle?
  The cycle, starting with the caller of the wait that closes it: the first wait met
  going backward from ``node`` along the cycle, i.e. the wait whose awaited work reaches
  ``node`` through state edges only ("the awaited work reaching its permit
  wait" closes the cycle of the wait on that work).

Every cycle holds at least one wait edge (slot and permit edges lead to owners and to
blocked permit holders), so a driver that asks ``closing_cycle`` for every new wait and
``cycle_through`` for every node that gains edges, and ends each wait it is told closes
a cycle, keeps the graph free of cycles: a cycle can only be formed by a new edge.

Searches are depth-first, iterative, each node expanded at most once: linear in the
part of the graph reachable from where they start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeAlias, TypeVar

N = TypeVar("N")

Edge: TypeAlias = tuple[N, str]
"""A successor and the label of the edge to it."""

Step: TypeAlias = tuple[N, str]
"""One node of a cycle and the label of its edge to the next node (the last: to the first)."""


class Wait(Generic[N]):
    """One blocked wait: ``caller`` waits for ``target`` (the driver's ``kind``, ``data``)."""

    __slots__ = ("caller", "data", "kind", "target")

    def __init__(self, caller: N, target: object, kind: object = None) -> None:
        self.caller = caller
        self.target = target
        self.kind = kind
        self.data: object = None  # the driver's own (its scope, its error)

    def __repr__(self) -> str:
        return f"Wait({self.caller!r} -> {self.target!r})"


class WaitFor(Generic[N]):
    """The blocked waits of one supervisor, and cycle searches over the wait-for graph."""

    __slots__ = ("_state_edges", "_wait_edges", "waits")

    def __init__(
        self,
        state_edges: Callable[[N], Iterable[Edge[N]]],
        wait_edges: Callable[[Wait[N]], Iterable[Edge[N]]],
    ) -> None:
        self._state_edges = state_edges
        self._wait_edges = wait_edges
        self.waits: dict[N, list[Wait[N]]] = {}  # blocked callers, in blocking order

    def __bool__(self) -> bool:
        """Whether any wait is registered."""
        return bool(self.waits)

    def add(self, wait: Wait[N]) -> None:
        """Register ``wait``: its caller is blocked in it from now on."""
        waits = self.waits.get(wait.caller)
        if waits is None:
            self.waits[wait.caller] = [wait]
        else:
            waits.append(wait)

    def remove(self, wait: Wait[N]) -> None:
        """Forget ``wait`` (it ended, or raised); nothing if it is not registered."""
        waits = self.waits.get(wait.caller)
        if waits is None or wait not in waits:
            return
        waits.remove(wait)
        if not waits:
            del self.waits[wait.caller]

    def edges(self, node: N) -> Iterator[tuple[N, str, Wait[N] | None]]:
        """``node``'s edges: (successor, label, the wait it belongs to or ``None``)."""
        waits = self.waits.get(node)
        if waits is None:
            for successor, label in self._state_edges(node):
                yield successor, label, None
            return
        for wait in waits:
            for successor, label in self._wait_edges(wait):
                yield successor, label, wait

    def closing_cycle(
        self, wait: Wait[N], edges: Iterable[Edge[N]] | None = None
    ) -> list[Step[N]] | None:
        """The cycle the registered ``wait`` closes, from its caller; ``None`` if none.

        ``edges``: the wait's edges to search from instead of ``wait_edges`` (a stopping
        caller's, whose own waits have none, to find a wait for itself).
        """
        caller = wait.caller
        for successor, label in self._wait_edges(wait) if edges is None else edges:
            path = self._path(successor, caller)
            if path is not None:
                return [(caller, label), *((node, lab) for node, lab, _ in path)]
        return None

    def cycle_through(self, node: N) -> tuple[Wait[N], list[Step[N]]] | None:
        """A cycle through ``node`` (which gained edges), and the wait that closes it.

        The cycle starts with that wait's caller. ``None`` when ``node`` is on no cycle.
        """
        for successor, label, wait in self.edges(node):
            path = self._path(successor, node)
            if path is None:
                continue
            # The cycle from node: (node, label, wait), then the path's steps.
            steps: list[tuple[N, str, Wait[N] | None]] = [(node, label, wait), *path]
            for i in range(len(steps) - 1, -1, -1):
                closing = steps[i][2]
                if closing is not None:
                    rotated = steps[i:] + steps[:i]
                    return closing, [(n, lab) for n, lab, _ in rotated]
            raise AssertionError(f"a wait-for cycle without a wait: {steps!r}")
        return None

    def _path(self, start: N, goal: N) -> list[tuple[N, str, Wait[N] | None]] | None:
        """A path from ``start`` to ``goal``: its nodes but ``goal``, each with its out-edge.

        ``[]`` when ``start`` is ``goal``.
        """
        if start is goal:
            return []
        seen = {id(start)}
        # Depth-first: the current path, and each node's remaining edges.
        path: list[tuple[N, str, Wait[N] | None]] = []
        stack: list[tuple[N, Iterator[tuple[N, str, Wait[N] | None]]]] = [
            (start, self.edges(start))
        ]
        while stack:
            node, edges = stack[-1]
            for successor, label, wait in edges:
                if successor is goal:
                    return [*path, (node, label, wait)]
                if id(successor) in seen:
                    continue
                seen.add(id(successor))
                path.append((node, label, wait))
                stack.append((successor, self.edges(successor)))
                break
            else:
                stack.pop()
                if path:
                    path.pop()
        return None
