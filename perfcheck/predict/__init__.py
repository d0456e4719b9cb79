"""Predict: the analytical model of a training step, per module (docs/model.md).

``module_estimator.estimate`` (public as ``perfcheck.estimate``)
traces a model under fake tensors (``trace``), costs every aten op from one registry
(``aten_costs`` → ``formulas``), adds collectives (``collectives``, ``zero``, ``sharding``) and
turns work into time on a system (``roofline``). ``transformer`` is the closed-form front-end for
GPT-style layouts (model files in ``model_files/``); ``for_run`` is the one reader/writer of a
run's predicted.csv/json; ``whatif`` re-times a saved prediction on another system."""
