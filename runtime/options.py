"""The one table of task and actor options: name, check, default, who accepts it.

Serves ``@lumos.remote(...)``, ``.options(...)`` and the ``%%remote`` flags alike.
Names and defaults are Ray's.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

TASK, ACTOR = "task", "actor"


def _non_negative_number(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, not {type(v).__name__}")
    if v < 0 or math.isnan(v) or math.isinf(v):
        raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")


def _num_gpus(name: str, v: Any) -> None:
    _non_negative_number(name, v)
    if v > 1 and v != int(v):
        raise ValueError(f"{name}={v!r}: fractions are allowed only below 1; above 1 use a whole number")


def _int_at_least(minimum: int) -> Callable[[str, Any], None]:
    def check(name: str, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, not {type(v).__name__}")
        if v < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return check


def _resources(name: str, v: Any) -> None:
    if not isinstance(v, dict):
        raise TypeError(f"resources must be a dict of name -> amount, not {type(v).__name__}")
    for k, amount in v.items():
        if not isinstance(k, str):
            raise TypeError(f"resource names must be str, got {k!r}")
        if k in ("CPU", "GPU"):
            raise ValueError(f"use num_cpus/num_gpus instead of resources={{'{k}': ...}}")
        _non_negative_number(f"resources[{k!r}]", amount)


def _retry_exceptions(name: str, v: Any) -> None:
    if isinstance(v, bool):
        return
    if isinstance(v, (list, tuple)) and all(isinstance(c, type) and issubclass(c, BaseException) for c in v):
        return
    raise TypeError("retry_exceptions must be a bool or a list of exception classes")


def _str_or_none(name: str, v: Any) -> None:
    if v is not None and not isinstance(v, str):
        raise TypeError(f"{name} must be a str, not {type(v).__name__}")


def _num_returns(name: str, v: Any) -> None:
    if v in ("streaming", "dynamic"):
        return
    _int_at_least(0)(name, v)


def num_returns_of(value: Any, fn: Any, given: bool) -> int:
    """The wire form of ``num_returns``: -1 streams (``"streaming"``, and generator
    functions unless ``num_returns`` was given)."""
    import inspect
    if inspect.isasyncgenfunction(fn):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)} is an async generator: a task streams from "
                        "a plain generator function (async generators stream as methods of actors)")
    if value in ("streaming", "dynamic") and not inspect.isgeneratorfunction(fn):
        raise ValueError(f"num_returns={value!r} needs a generator function (one that yields), and "
                         f"{getattr(fn, '__qualname__', fn)} is not one")
    if value == "streaming" or (not given and inspect.isgeneratorfunction(fn)):
        return -1
    if value == "dynamic":
        return 1  # one ref, whose value is a DynamicObjectRefGenerator
    return int(value)


def _strategy(name: str, v: Any) -> None:
    from lumos.util.scheduling_strategies import strategy_to_wire
    strategy_to_wire(v)


def _label_selector(name: str, v: Any) -> None:
    from lumos.util.scheduling_strategies import label_selector_to_wire
    label_selector_to_wire(v)


def _fallback_strategy(name: str, v: Any) -> None:
    from lumos.util.scheduling_strategies import label_selector_to_wire
    label_selector_to_wire(None, v)


def _lifetime(name: str, v: Any) -> None:
    if v not in (None, "detached", "non_detached"):
        raise ValueError(f"lifetime must be None, 'detached' or 'non_detached', got {v!r}")


def _bool(name: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, not {type(v).__name__}")


def _concurrency_groups(name: str, v: Any) -> None:
    if v is None:
        return
    if not isinstance(v, dict) or not all(isinstance(k, str) and k and isinstance(n, int)
                                          and not isinstance(n, bool) and n >= 1 for k, n in v.items()):
        raise TypeError("concurrency_groups must be a dict of group name -> number of calls at once (int >= 1)")


def _anything(name: str, v: Any) -> None:
    return None


def _unsupported(instead: str, allowed: tuple[Any, ...] = (None, False)) -> Callable[[str, Any], None]:
    """A Ray option lumos does not implement: its default (or an empty value) passes, any
    other value raises ``NotImplementedError`` saying what to use instead."""
    def check(name: str, v: Any) -> None:
        if any(v is a or (a is not None and a is not False and v == a) for a in allowed) or v in ({}, [], ()):
            return
        from lumos._private.compat import not_implemented_error
        raise not_implemented_error(f"the option {name}={v!r}", instead)
    return check


def _runtime_env(name: str, v: Any) -> None:
    env_vars_of(v)


#: runtime_env keys init() takes; a task's or actor's take env_vars only.
JOB_RUNTIME_ENV_KEYS = {"env_vars", "working_dir", "py_modules", "excludes", "worker_process_setup_hook"}

#: Ray's runtime_env keys for what lumos does not install (a package manager's packages, a
#: container, a profiler); accepted when empty (None, [], {}, ""), as there is nothing to do.
_EMPTY_ONLY_KEYS = {"pip", "conda", "uv", "container", "image_uri", "nsight", "mpi", "java_jars"}


#: Keys of Ray's ``runtime_env["config"]`` (RuntimeEnvConfig). lumos accepts them and has
#: nothing to apply: env_vars need no setup, so there is no setup to time out or install early.
_ENV_CONFIG_KEYS = {"setup_timeout_seconds", "eager_install", "log_files"}


def _check_env_config(config: Any) -> None:
    if config is None:
        return
    if not isinstance(config, dict):
        raise TypeError(f"runtime_env['config'] must be a dict, not {type(config).__name__}")
    unknown = set(config) - _ENV_CONFIG_KEYS
    if unknown:
        raise ValueError(f"runtime_env['config'] keys {sorted(unknown)} are unknown; "
                         f"valid: {sorted(_ENV_CONFIG_KEYS)}")


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (list, tuple, dict, str)) and not value)


def env_vars_of(runtime_env: Any, job: bool = False) -> dict[str, str] | None:
    """The ``env_vars`` of a ``runtime_env`` option (checked), or None when it sets none.
    ``job``: the runtime_env of ``init()``, which may also hold working_dir, py_modules,
    excludes and worker_process_setup_hook."""
    if runtime_env is None:
        return None
    if not isinstance(runtime_env, dict):
        raise TypeError(f"runtime_env must be a dict, not {type(runtime_env).__name__}")
    _check_env_config(runtime_env.get("config"))
    unsupported = {k for k in set(runtime_env) - (JOB_RUNTIME_ENV_KEYS if job else {"env_vars"}) - {"config"}
                   if not (k in _EMPTY_ONLY_KEYS and _empty(runtime_env[k]))}
    if unsupported and not job and unsupported <= JOB_RUNTIME_ENV_KEYS:
        raise ValueError(f"runtime_env {sorted(unsupported)} can be set for the whole job only, in "
                         "lumos.init(runtime_env=...); a task's or actor's runtime_env takes env_vars")
    if unsupported:
        raise ValueError(f"runtime_env keys {sorted(unsupported)} are not supported; lumos supports "
                         + ("env_vars, working_dir, py_modules, excludes and worker_process_setup_hook" if job
                            else "env_vars"))
    hook = runtime_env.get("worker_process_setup_hook")
    if hook is not None and not callable(hook) and not (isinstance(hook, str) and "." in hook.strip(".")):
        raise TypeError("runtime_env['worker_process_setup_hook'] must be a function or a 'module.function' name, "
                        f"not {hook!r}")
    env = runtime_env.get("env_vars")
    if env is None:
        return None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TypeError("runtime_env['env_vars'] must be a dict of str -> str")
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in env.items()):
        raise ValueError("runtime_env['env_vars'] has a name that is empty or holds '=' or a NUL byte, "
                         "or a value that holds a NUL byte")
    return dict(env) or None


@dataclass(frozen=True)
class Option:
    check: Callable[[str, Any], None]
    task_default: Any
    actor_default: Any
    applies: frozenset[str]
    doc: str


_BOTH = frozenset((TASK, ACTOR))
_T = frozenset((TASK,))
_A = frozenset((ACTOR,))

OPTIONS: dict[str, Option] = {
    "num_cpus": Option(_non_negative_number, 1, None, _BOTH, "CPUs reserved (actors: 1 to place, 0 held)"),
    "num_gpus": Option(_num_gpus, 0, 0, _BOTH, "GPUs reserved; fractions below 1 share a GPU"),
    "memory": Option(_non_negative_number, None, None, _BOTH, "bytes of memory reserved"),
    "resources": Option(_resources, None, None, _BOTH, "custom resources, name -> amount"),
    "accelerator_type": Option(_str_or_none, None, None, _BOTH, "accelerator type label"),
    "num_returns": Option(_num_returns, 1, None, _T, "number of return values (refs)"),
    "max_retries": Option(_int_at_least(-1), 3, None, _T, "retries after a worker dies (-1: forever)"),
    "retry_exceptions": Option(_retry_exceptions, False, None, _T, "also retry when the task raises"),
    "name": Option(_str_or_none, None, None, _BOTH, "task name (shown in the dashboard), or actor name"),
    "scheduling_strategy": Option(_strategy, None, None, _BOTH, "DEFAULT, SPREAD, node affinity, PG"),
    "runtime_env": Option(_runtime_env, None, None, _BOTH, "environment for the worker (env_vars)"),
    "max_calls": Option(_int_at_least(0), None, None, _T,
                        "runs of this function a worker makes before it exits (0: no limit; "
                        "default 0, and 1 for GPU tasks, which frees their GPU memory)"),
    "max_restarts": Option(_int_at_least(-1), None, 0, _A, "restarts after the actor's process dies"),
    "max_task_retries": Option(_int_at_least(-1), None, 0, _A, "retries of calls in flight at a restart"),
    "max_concurrency": Option(_int_at_least(1), None, None, _A, "calls run at once (threads or async)"),
    "namespace": Option(_str_or_none, None, None, _A, "namespace of a named actor"),
    "lifetime": Option(_lifetime, None, None, _A, "'detached': outlives its driver"),
    "get_if_exists": Option(_bool, None, False, _A, "return the existing named actor"),
    "checkpoint_interval": Option(_int_at_least(1), None, 1, _A,
                                  "calls between checkpoints (classes with __lumos_checkpoint__)"),
    "max_pending_calls": Option(_int_at_least(-1), None, -1, _A, "calls queued before raising"),
    "concurrency_groups": Option(_concurrency_groups, None, None, _A,
                                 "named groups of calls, name -> how many run at once"),
    "placement_group": Option(_anything, None, None, _BOTH, "legacy: use scheduling_strategy"),
    "placement_group_bundle_index": Option(_int_at_least(-1), None, None, _BOTH, "legacy"),
    "placement_group_capture_child_tasks": Option(_anything, None, None, _BOTH, "legacy"),
    "_metadata": Option(_anything, None, None, _BOTH, "ignored"),
    "label_selector": Option(_label_selector, None, None, _BOTH,
                             "node labels: label -> 'value', '!value', 'in(a, b)', '!in(a, b)'"),
    "fallback_strategy": Option(_fallback_strategy, None, None, _BOTH,
                                "label selectors tried in order when no node meets label_selector: "
                                "[{'label_selector': {...}}, ...]"),
    "object_store_memory": Option(_unsupported("lumos does not reserve object store memory per task or actor; "
                                               "size the store with lumos.init(object_store_memory=...)"),
                                  None, None, _BOTH, "per-task store memory (not implemented: raises)"),
    "allow_out_of_order_execution": Option(_unsupported("calls from one caller run in order; use an async or "
                                                        "threaded actor (max_concurrency) to overlap them"),
                                           None, False, _A, "out-of-order calls (not implemented: raises if True)"),
    "enable_tensor_transport": Option(_unsupported("lumos has no GPU tensor transport; values go through the "
                                                   "object store"), None, False, _A,
                                      "GPU tensor transport (not implemented: raises if True)"),
    "enable_task_events": Option(_bool, True, True, _BOTH,
                                 "record this task's state changes for the state API and dashboard"),
}


def validate(options: dict[str, Any], kind: str) -> dict[str, Any]:
    """Check ``options`` for a task or actor; raise TypeError/ValueError naming the problem."""
    for name, value in options.items():
        opt = OPTIONS.get(name)
        if opt is None or kind not in opt.applies:
            valid = sorted(n for n, o in OPTIONS.items() if kind in o.applies and not n.startswith("_"))
            raise ValueError(f"invalid option {name!r} for a remote {'function' if kind == TASK else 'class'}; "
                             f"valid options: {', '.join(valid)}")
        if value is not None or name in ("num_cpus", "num_gpus"):
            if value is None:
                continue
            opt.check(name, value)
    return options


def merged(base: dict[str, Any], changes: dict[str, Any], kind: str) -> dict[str, Any]:
    """``base`` with ``changes`` applied, after checking ``changes`` (``.options(...)``)."""
    validate(changes, kind)
    out = dict(base)
    out.update(changes)
    return out


def resolved(options: dict[str, Any], kind: str) -> dict[str, Any]:
    """Options with defaults filled in."""
    out = {}
    for name, opt in OPTIONS.items():
        if kind in opt.applies:
            default = opt.task_default if kind == TASK else opt.actor_default
            out[name] = options.get(name, default)
    return out


def resource_request(opts: dict[str, Any], kind: str) -> dict[str, float]:
    """The resources a task (or an actor's creation) asks for."""
    res: dict[str, float] = {}
    cpus = opts.get("num_cpus")
    if cpus is None:
        cpus = 1 if kind == TASK else 0
    if cpus:
        res["CPU"] = float(cpus)
    if opts.get("num_gpus"):
        res["GPU"] = float(opts["num_gpus"])
    if opts.get("memory"):
        res["memory"] = float(opts["memory"])
    for k, v in (opts.get("resources") or {}).items():
        if v:
            res[k] = float(v)
    if opts.get("accelerator_type"):
        res[f"accelerator_type:{opts['accelerator_type']}"] = 0.001
    return res


#: CPUs an actor that asks for no resources needs free on a node to be placed there (it
#: holds none once created), as in Ray: such actors never land on a node without CPUs.
ACTOR_PLACEMENT_CPUS = 1.0


def placement_cpus(opts: dict[str, Any]) -> float:
    """CPUs an actor's placement needs beyond what it holds: ``ACTOR_PLACEMENT_CPUS`` when
    its options ask for no resources (``memory`` aside, as in Ray), else 0."""
    if opts.get("num_cpus") is None and not opts.get("num_gpus") and not opts.get("resources") \
            and not opts.get("accelerator_type"):
        return ACTOR_PLACEMENT_CPUS
    return 0.0


def check_group_request(opts: dict[str, Any], resources: dict[str, float], what: str) -> None:
    """A task's request against its placement group's bundles, where this process knows them
    (it made the group, or looked it up by name): a bundle index out of range, or a request
    no chosen bundle can hold, is a ``ValueError`` at ``.remote()``, as in Ray (the raylet
    would refuse the lease)."""
    from lumos.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    strategy = opts.get("scheduling_strategy")
    if isinstance(strategy, PlacementGroupSchedulingStrategy):
        group, index = strategy.placement_group, strategy.placement_group_bundle_index
    elif strategy is None and opts.get("placement_group") not in (None, "default"):
        group = opts["placement_group"]
        index = -1 if opts.get("placement_group_bundle_index") is None else opts["placement_group_bundle_index"]
    else:
        return
    bundles = getattr(group, "bundle_cache", None)
    if not bundles:
        return  # not known here (or removed: the task fails with TaskPlacementGroupRemoved)
    if not -1 <= index < len(bundles):
        raise ValueError(f"placement_group_bundle_index={index} is out of range for {what}'s placement group of "
                         f"{len(bundles)} bundle(s) (use 0..{len(bundles) - 1}, or -1 for any bundle)")
    chosen = bundles if index == -1 else [bundles[index]]
    wanted = {k: v for k, v in resources.items() if v > 0}
    if not any(all(b.get(k, 0) >= v for k, v in wanted.items()) for b in chosen):
        which = "any bundle" if index == -1 else f"bundle {index}"
        held = chosen[0] if len(chosen) == 1 else chosen
        raise ValueError(f"{what} asks for {wanted}, more than {which} of its placement group holds ({held}); "
                         "ask for at most what a bundle holds")


def strategy_of(opts: dict[str, Any]) -> Any:
    from lumos.util.scheduling_strategies import (PlacementGroupSchedulingStrategy, label_selector_to_wire,
                                                  strategy_to_wire)
    strategy = opts.get("scheduling_strategy")
    labels = label_selector_to_wire(opts.get("label_selector"), opts.get("fallback_strategy"), strategy == "SPREAD")
    if labels is not None:
        if strategy not in (None, "DEFAULT", "SPREAD") or opts.get("placement_group") not in (None, "default"):
            raise ValueError(f"label_selector or fallback_strategy with scheduling_strategy={strategy!r} is not "
                             "implemented in lumos: labels choose among nodes with the default strategy or "
                             "SPREAD (drop one of the two)")
        return labels
    if strategy is None and opts.get("placement_group") not in (None, "default"):
        strategy = PlacementGroupSchedulingStrategy(
            opts["placement_group"], -1 if opts.get("placement_group_bundle_index") is None
            else opts["placement_group_bundle_index"],
            opts.get("placement_group_capture_child_tasks"))
    return strategy_to_wire(strategy)
