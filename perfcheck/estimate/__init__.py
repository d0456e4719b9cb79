"""The estimator's modules (trace, formulas, roofline, collectives, ...), and, as a call,
``perfcheck.estimate(model, example_inputs, ...)``.

The package and the facade function share the name ``estimate``. Python binds
``perfcheck.estimate`` to this package as soon as any of its modules is imported, so the package
itself is made callable: calling it runs ``module_estimator.estimate``. Both
``perfcheck.estimate(model, inputs)`` and ``import perfcheck.estimate.roofline`` work, in any order.
"""
import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from perfcheck.estimate.module_estimator import estimate

        return estimate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
