"""Every public error type and option class is importable from ``fairq`` itself."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import subprocess
import sys

import pytest

import fairq
from fairq import config, errors


def public_classes(module: object) -> list[str]:
    return [
        name
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and value.__module__ == getattr(module, "__name__", None)
        and not name.startswith("_")
    ]


@pytest.mark.parametrize(
    "module",
    [errors, config],
    ids=["errors", "config"],
)
def test_every_public_error_and_option_class_is_exported(module: object) -> None:
    names = public_classes(module)
    assert names  # the module defines some
    missing = [n for n in names if n not in fairq.__all__]
    assert not missing, f"not exported from fairq: {missing}"
    for name in names:
        assert getattr(fairq, name) is getattr(module, name)


def test_every_error_type_derives_from_fairq_error_or_is_permanent_error() -> None:
    for name in public_classes(errors):
        cls = getattr(errors, name)
        if issubclass(cls, BaseException):
            assert issubclass(cls, fairq.FairqError) or cls is fairq.PermanentError, name


def test_option_classes_are_dataclasses() -> None:
    for name in public_classes(config):
        assert dataclasses.is_dataclass(getattr(config, name)), name


def test_all_resolves_and_matches_the_lazy_table() -> None:
    assert sorted(fairq.__all__) == sorted(fairq._EXPORTS)
    assert len(set(fairq.__all__)) == len(fairq.__all__)
    for name in fairq.__all__:
        module = importlib.import_module(fairq._EXPORTS[name])
        assert getattr(fairq, name) is getattr(module, name)
    assert set(fairq.__all__) <= set(dir(fairq))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = fairq.Nope


def test_star_import_and_a_fast_bare_import() -> None:
    namespace: dict[str, object] = {}
    exec("from fairq import *", namespace)
    assert {"Fairq", "RetryPolicy", "TaskTimeoutError", "Worker"} <= set(namespace)
    # importing fairq alone loads neither the store nor redis (fairq --help stays fast)
    code = "import sys, fairq; print('redis' in sys.modules, 'fairq.store' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
