"""What the checker reports: a ``Finding`` (a protocol fault, raised where the model sees it, with
the events that led to it) and ``KINDS``, the kinds of fault it tells apart.

Every module of the checker raises a Finding, and ``explore.Report``, the command line and the tests
read its kind: it lives apart from the model that raises it so that all of them can name it without
importing the machine.
"""


class Finding(Exception):
    """A protocol fault: ``kind`` is one of KINDS, ``message`` says what, ``trace`` the last events."""

    def __init__(self, kind: str, message: str, trace: tuple[str, ...] = ()):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.trace = trace


KINDS = {
    "deadlock": "a wait that can never complete (every live role blocked)",
    "overrun": "a barrier phase completed again before a waiter observed the previous one, or more "
    "arrivals than its count",
    "bytes": "transaction bytes that do not match: more bytes landed than announced, or a phase "
    "held open by bytes that never come",
    "arrivals": "a CTA exited with a barrier phase partly arrived (an arrival count that does not match)",
    "exit": "a CTA exited while a peer could still write into its shared memory, TMEM or barriers, "
    "or with its own TMA stores still reading shared memory",
    "coverage": "an output tile not stored exactly once, or stored from an accumulator that did not "
    "consume every K block of its rows and columns exactly once",
    "clc": "a try_cancel issued after the cluster was answered 'no work left'",
    "init": "a write into a peer CTA's shared memory or barriers before a cluster barrier has shown "
    "that the peer's mbarriers exist",
    "race": "shared memory overwritten (TMA load, store, copy) while an MMA or a TMA store issued before "
    "may still read it",
    "flags": "a flag of a clean global workspace left set when the kernel ends (tilus zeroes it "
    "once; each launch must leave it zero for the next)",
    "livelock": "the run did not end within its step budget",
    "unsupported": "the kernel uses something the checker does not model",
}
