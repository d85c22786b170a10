"""Wait-for cycle detection (``_waitfor``): pure, synchronous tests against a graph model.

Examples pin the two questions the module answers (does a new wait close a cycle; which
wait closes a cycle through a node that gained edges); a Hypothesis stateful machine
adds and removes waits and state edges at random, compares every answer with plain
reachability over an explicit adjacency model, and checks that a driver following the
module's contract keeps the graph acyclic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

# The module's own names: private, so they come through helpers like every internal.
from helpers import Wait, WaitFor


class Node:
    """A graph node, compared by identity (as the supervisor's records are)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Graph:
    """An explicit model: state edges of every node, and the registered waits."""

    def __init__(self, nodes: Iterable[Node] = ()) -> None:
        self.state: dict[Node, list[Node]] = {node: [] for node in nodes}
        self.waits: list[Wait[Node]] = []
        self.wf: WaitFor[Node] = WaitFor(self.state_edges, self.wait_edges)

    def state_edges(self, node: Node) -> list[tuple[Node, str]]:
        return [(other, f"s:{other}") for other in self.state[node]]

    @staticmethod
    def wait_edges(wait: Wait[Node]) -> list[tuple[Node, str]]:
        target = wait.target
        assert isinstance(target, Node)
        return [(target, f"w:{target}")]

    def wait(self, caller: Node, target: Node) -> Wait[Node]:
        w: Wait[Node] = Wait(caller, target)
        self.wf.add(w)
        self.waits.append(w)
        return w

    def drop(self, wait: Wait[Node]) -> None:
        self.wf.remove(wait)
        self.waits.remove(wait)

    # The model: a caller's edges are its waits' targets, anyone else's its state edges.

    def callers(self) -> set[Node]:
        return {w.caller for w in self.waits}

    def edges(self, node: Node) -> list[Node]:
        targets = [w.target for w in self.waits if w.caller is node]
        return targets if targets else list(self.state[node])  # type: ignore[arg-type]

    def reaches(self, start: Node, goal: Node) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node is goal:
                return True
            if id(node) in seen:
                continue
            seen.add(id(node))
            todo.extend(self.edges(node))
        return False

    def on_cycle(self, node: Node) -> bool:
        return any(self.reaches(after, node) for after in self.edges(node))

    def acyclic(self) -> bool:
        return not any(self.on_cycle(node) for node in self.state)

    def check_cycle(self, steps: list[tuple[Node, str]]) -> None:
        """``steps`` is a cycle of the model: each node has an edge to the next."""
        assert steps
        nodes = [node for node, _ in steps]
        for i, (node, label) in enumerate(steps):
            after = nodes[(i + 1) % len(nodes)]
            assert any(after is e for e in self.edges(node)), (node, after, steps)
            assert label.endswith(f":{after}")
        assert len({id(n) for n in nodes}) == len(nodes), f"a node repeats: {steps}"


def nodes(*names: str) -> list[Node]:
    return [Node(name) for name in names]


# -- examples ----------------------------------------------------------------------------------


def test_a_wait_on_oneself_closes_a_cycle() -> None:
    """A caller waiting for itself is a cycle of one."""
    (a,) = nodes("a")
    g = Graph([a])
    w = g.wait(a, a)
    assert g.wf.closing_cycle(w) == [(a, "w:a")]


def test_a_wait_on_work_queued_behind_the_caller_closes_a_cycle() -> None:
    """a waits for q, q (state edge) waits for a: the cycle starts with the caller."""
    a, q = nodes("a", "q")
    g = Graph([a, q])
    g.state[q] = [a]
    w = g.wait(a, q)
    assert g.wf.closing_cycle(w) == [(a, "w:q"), (q, "s:a")]


def test_a_wait_on_free_work_closes_no_cycle() -> None:
    """A path that leads nowhere back is no cycle."""
    a, q, o = nodes("a", "q", "o")
    g = Graph([a, q, o])
    g.state[q] = [o]
    w = g.wait(a, q)
    assert g.wf.closing_cycle(w) is None


def test_a_satisfied_wait_has_no_edges_and_closes_nothing() -> None:
    """A wait whose driver reports no edges (satisfied, or a stopping caller) is not an edge."""
    a, q = nodes("a", "q")
    wf: WaitFor[Node] = WaitFor(lambda n: [(a, "s")] if n is q else [], lambda w: [])
    w: Wait[Node] = Wait(a, q)
    wf.add(w)
    assert wf.closing_cycle(w) is None
    assert wf.cycle_through(q) is None


def test_closing_cycle_searches_from_the_edges_it_is_given() -> None:
    """Given edges (a stopping caller's, whose waits report none), the search starts from
    them: the wait that could end only once its caller has is found."""
    a, q = nodes("a", "q")
    wf: WaitFor[Node] = WaitFor(lambda n: [(a, "s:a")] if n is q else [], lambda w: [])
    w: Wait[Node] = Wait(a, q)
    wf.add(w)
    assert wf.closing_cycle(w, [(q, "w:q")]) == [(a, "w:q"), (q, "s:a")]
    assert wf.closing_cycle(w, []) is None


def test_two_slot_cycle_is_closed_by_the_second_wait() -> None:
    """a waits for x (behind b), b then waits for y (behind a): b's wait closes it."""
    a, b, x, y = nodes("a", "b", "x", "y")
    g = Graph([a, b, x, y])
    g.state[x] = [b]
    g.state[y] = [a]
    first = g.wait(a, x)
    assert g.wf.closing_cycle(first) is None
    second = g.wait(b, y)
    assert g.wf.closing_cycle(second) == [(b, "w:y"), (y, "s:a"), (a, "w:x"), (x, "s:b")]


def test_a_later_edge_is_attributed_to_the_wait_on_the_work_that_gained_it() -> None:
    """a waits for w; w reaches its permit wait (w -> a): a's wait closes the cycle."""
    a, w = nodes("a", "w")
    g = Graph([a, w])
    wait = g.wait(a, w)
    assert g.wf.closing_cycle(wait) is None
    g.state[w] = [a]
    found = g.wf.cycle_through(w)
    assert found is not None
    closing, cycle = found
    assert closing is wait
    assert cycle == [(a, "w:w"), (w, "s:a")]


def test_the_closing_wait_is_the_first_met_going_backward() -> None:
    """Of two waits on the cycle, the one whose work reaches the new edge by state edges."""
    c1, q, o, x = nodes("c1", "q", "o", "x")
    g = Graph([c1, q, o, x])
    g.state[q] = [o]  # q is queued behind o
    w1 = g.wait(c1, q)
    w2 = g.wait(o, x)  # o waits for x, which has no edges yet
    assert g.wf.closing_cycle(w1) is None
    assert g.wf.closing_cycle(w2) is None
    g.state[x] = [c1]  # x is taken in behind c1's slot
    found = g.wf.cycle_through(x)
    assert found is not None
    closing, cycle = found
    assert closing is w2
    assert [n for n, _ in cycle] == [o, x, c1, q]


def test_cycle_through_a_node_on_no_cycle_is_none() -> None:
    """A node that gained edges but is on no cycle gives None."""
    a, b = nodes("a", "b")
    g = Graph([a, b])
    g.state[a] = [b]
    assert g.wf.cycle_through(a) is None


def test_removing_a_wait_that_is_not_registered_is_harmless() -> None:
    """remove() of an unknown wait changes nothing."""
    (a,) = nodes("a")
    g = Graph([a])
    g.wf.remove(Wait(a, a))
    assert not g.wf


def test_one_caller_may_block_in_several_waits() -> None:
    """A caller blocked in two waits (two child tasks) has the edges of both."""
    a, b, c = nodes("a", "b", "c")
    g = Graph([a, b, c])
    g.wait(a, b)
    w2 = g.wait(a, c)
    g.state[c] = [a]
    assert g.wf.closing_cycle(w2) == [(a, "w:c"), (c, "s:a")]


# -- the stateful model ------------------------------------------------------------------------

NODE_COUNT = 7


class WaitForModel(RuleBasedStateMachine):
    """Random waits and state edges; every answer compared with the model's reachability."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes = nodes(*(f"n{i}" for i in range(NODE_COUNT)))
        self.g = Graph(self.nodes)

    @rule(caller=st.integers(0, NODE_COUNT - 1), awaited=st.integers(0, NODE_COUNT - 1))
    def new_wait(self, caller: int, awaited: int) -> None:
        """A new wait raises exactly when its target reaches its caller."""
        g = self.g
        c, t = self.nodes[caller], self.nodes[awaited]
        # The caller runs an attempt: it is queued, held or waiting for a permit no
        # more, so it has lost its state edges (and gains none while it is a caller).
        g.state[c] = []
        wait = g.wait(c, t)
        cycle = g.wf.closing_cycle(wait)
        assert (cycle is not None) == g.reaches(t, c)
        if cycle is not None:
            g.check_cycle(cycle)
            assert cycle[0][0] is c
            assert cycle[1 % len(cycle)][0] is t
            g.drop(wait)  # it raised

    @rule(source=st.integers(0, NODE_COUNT - 1), dest=st.integers(0, NODE_COUNT - 1))
    def new_state_edge(self, source: int, dest: int) -> None:
        """A node gains an edge; the waits that close cycles through it end, one by one."""
        g = self.g
        u, v = self.nodes[source], self.nodes[dest]
        if u in g.callers() or source >= dest:
            # A blocked caller has only wait edges; and state edges alone form no cycle
            # (slot and permit edges lead to owners, and on to blocked permit holders),
            # which edges from lower to higher nodes model.
            return
        g.state[u].append(v)
        while True:
            found = g.wf.cycle_through(u)
            assert (found is not None) == g.on_cycle(u)
            if found is None:
                break
            closing, cycle = found
            g.check_cycle(cycle)
            order = [n for n, _ in cycle]
            assert order[0] is closing.caller
            assert any(u is n for n in order)
            after = order[1 % len(order)]
            assert after is closing.target
            # From the closing wait's work to u, only state edges: no caller between.
            callers = g.callers()
            index = next(i for i, n in enumerate(order) if n is u) if u is not after else 1
            assert not any(n in callers for n in order[1:index])
            g.drop(closing)  # it raised

    @precondition(lambda self: self.g.waits)
    @rule(data=st.data())
    def wait_ends(self, data: Any) -> None:
        """A wait ends (its target resolved, or its caller moved on)."""
        self.g.drop(data.draw(st.sampled_from(self.g.waits)))

    @rule(source=st.integers(0, NODE_COUNT - 1))
    def edges_vanish(self, source: int) -> None:
        """A node loses its state edges (its work started, ended, got a permit)."""
        self.g.state[self.nodes[source]] = []

    @invariant()
    def graph_is_acyclic(self) -> None:
        """Handled as the contract says, no wait-for cycle survives a step."""
        assert self.g.acyclic()

    @invariant()
    def registered_waits_match(self) -> None:
        model = sorted(id(w) for w in self.g.waits)
        registered = sorted(id(w) for waits in self.g.wf.waits.values() for w in waits)
        assert model == registered


TestWaitForModel = WaitForModel.TestCase
TestWaitForModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
