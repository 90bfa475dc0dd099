"""Hugging Face transformers specifics: key-value caches (off for a training step), ModelOutput,
and the masking code's export paths."""
import collections
import contextlib
import inspect
import sys


def _bound_names(model, args, kwargs=None):
    """The names of forward's parameters the example inputs are passed as."""
    try:
        return set(inspect.signature(model.forward).bind_partial(*args, **(kwargs or {})).arguments)
    except (TypeError, ValueError):
        return set()


@contextlib.contextmanager
def _follow_eager(model, args, kwargs=None):
    """While the model is exported, transformers' masking code takes the
    paths it takes in eager, decided from shapes alone as eager decides them.
    Under torch.export it takes its general path instead, because it cannot
    read values: a causal mask made explicit (eager leaves it to SDPA's
    is_causal), so K and V repeated for grouped-query attention (eager: SDPA's
    enable_gqa), and position ids checked for packed sequences (eager finds
    none in the positions the model makes itself). The general path stays
    where values decide: with an attention mask among the inputs (a padded
    batch needs the mask) or position ids given (they may pack sequences)."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None or not any(type(m).__module__.startswith("transformers.") for m in model.modules()):
        yield
        return
    patches = {"is_torchdynamo_exporting": lambda: False}
    if "position_ids" not in _bound_names(model, args, kwargs):
        patches["find_packed_sequence_indices"] = lambda *args, **kwargs: None
    patches = {n: f for n, f in patches.items() if hasattr(masking, n)}
    originals = {n: getattr(masking, n) for n in patches}
    try:
        for n, f in patches.items():
            setattr(masking, n, f)
        yield
    finally:
        for n, f in originals.items():
            setattr(masking, n, f)


def _model_output_fields(spec):
    """The field names of a transformers ModelOutput the program returns, or None."""
    kind = getattr(spec, "type", None)
    if isinstance(kind, type) and issubclass(kind, collections.OrderedDict) and hasattr(kind, "to_tuple"):
        return list(getattr(spec, "context", None) or [])
    return None


def _cache_configs(model):
    """The distinct configs of the model's modules with use_cache on
    (transformers' key-value caches)."""
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", False) is True:
            configs[id(config)] = config
    return list(configs.values())


@contextlib.contextmanager
def _caches_off(model):
    """transformers' key-value caches off while the model is exported (a
    training step makes none; a cache is no tensor output torch.export can
    save): each config a module holds with use_cache set, set back after."""
    configs = _cache_configs(model)
    try:
        for config in configs:
            config.use_cache = False
        yield
    finally:
        for config in configs:
            config.use_cache = True
