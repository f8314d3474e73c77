"""Letting go of Python's global interpreter lock while the host waits on a GPU.

Every engine entry point is called from Python holding the GIL, and keeps it unless told otherwise. A wait on the
device (a synchronize, a copy back to the host, a copy from pageable host memory, which first waits for the work
queued before it) can last the whole step; holding the GIL through it would stop the host's other Python threads
for as long. `GilReleased` lets go for the body of a `with` block. Nothing inside one may touch a Python object,
and it is entered only from a thread that holds the GIL.
"""

from std.ffi import external_call


struct GilReleased:
    """`with GilReleased(): <a wait on the device>`: the GIL released on entry and taken back on exit, also when the
    body raises (PyEval_SaveThread / PyEval_RestoreThread)."""

    var thread_state: Int

    def __init__(out self):
        self.thread_state = 0

    def __enter__(mut self):
        self.thread_state = external_call["PyEval_SaveThread", Int]()

    def __exit__(mut self):
        external_call["PyEval_RestoreThread", NoneType](self.thread_state)

    def __exit__(mut self, error: Error) -> Bool:
        external_call["PyEval_RestoreThread", NoneType](self.thread_state)
        return False
