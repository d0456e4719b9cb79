"""The user-facing session: ``PerfCheck`` (``perfcheck.PerfCheck``), the recording core of ``measure/`` with
the predicted-vs-measured report of ``analysis/`` and ``report/`` on top. Its floor sits above report and
below integrations, which build PerfCheck for DeepSpeed, Lightning and Hugging Face loops."""
