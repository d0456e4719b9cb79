"""Cost of the eval-phase decision (#14) on the module timer's lean forward path: building a _Call
with the phase taken from the enclosing call / grad mode vs the constant FWD it used before.
Process CPU time, one intra-op thread, 9 interleaved rounds of 200,000 calls, medians."""
import time, statistics, torch
torch.set_num_threads(1)
from perfcheck.measure.timer.records import EVAL, FWD, new_call as _Call  # (a record, made as the lean path makes it)
stack=[]; grad=True; N=200000
def old():
    for _ in range(N):
        c=_Call("p", FWD, 1)
def new():
    for _ in range(N):
        c=_Call("p", stack[-1].phase if stack else (FWD if grad else EVAL), 1)
        if not stack and not grad:
            c.top=True
ro, rn = [], []
for _ in range(9):
    for f, acc in ((old, ro), (new, rn)):
        t=time.process_time(); f(); acc.append((time.process_time()-t)/N*1e9)
print(f"old {statistics.median(ro):.1f} ns/call, new {statistics.median(rn):.1f} ns/call, added {statistics.median(rn)-statistics.median(ro):.1f} ns")
