"""Analysis: predicted vs measured, the gaps and their reasons.

``pipeline`` turns a run directory or a live PerfCheck into the
reconciled table (the one assembly path); ``reconcile`` joins and computes gaps; ``findings`` names
the reason for each large gap (one rule per diagnosis; ``page_faults`` the step phases' first-touch faults); ``stages`` compares runs of one model under
several ZeRO stages and ``answers`` answers the user's questions about them by rules over the data."""
