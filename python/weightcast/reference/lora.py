"""LoRA adapters in the torch reference engine (docs/lora.md): each TP worker's shards of an
adapter the Receiver committed, and what they add to its layers' weights in the forward.

An adapter of rank r adds ``(lora_alpha / r) * B @ A`` to each adapted module's weight W [out, in]
(A [r, in], B [out, r]), for the requests that name it. Each worker keeps only the shards its base
layer's split needs, as vLLM's and SGLang's LoRA layers do:

- column-parallel modules (q/k/v_proj, fused into ``qkv_proj``; gate/up_proj into
  ``gate_up_proj``): B is narrowed like the weight's rows (k/v by the rank's KV heads), A is whole;
- row-parallel modules (o_proj, down_proj): A is narrowed like the weight's columns, B is whole,
  and the rank's partial product joins the layer's all-reduce.

So a worker's delta is exactly its shard of the merged weight's delta. Other modules (embeddings,
lm_head, the draft) take no adapter: an update that targets them is refused at begin.
"""

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
SUPPORTED = COLUMN + ROW

_PREFIX = "base_model.model."


class AdapterError(Exception):
    """A request naming an adapter this engine cannot serve; `status` is the HTTP answer."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def check_targets(lora):
    """None when begin's "lora" object targets only modules this engine adapts; else the 400's
    message."""
    config = lora.get("config") if isinstance(lora, dict) else None
    targets = config.get("target_modules") if isinstance(config, dict) else None
    if not isinstance(targets, list):
        return None  # the Receiver's own parse names what is wrong
    unsupported = [t for t in targets if t not in SUPPORTED]
    if unsupported:
        return (
            f"lora.config.target_modules: {unsupported} not adapted by this engine "
            f"(it adapts {', '.join(SUPPORTED)})"
        )
    return None


def _module(name):
    """(layer index, 'self_attn'|'mlp', module, 'A'|'B') of a PEFT tensor name."""
    if name.startswith(_PREFIX):
        name = name[len(_PREFIX) :]
    parts = name.split(".")
    # model.layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight
    if len(parts) != 7 or parts[:2] != ["model", "layers"] or parts[5] not in ("lora_A", "lora_B"):
        raise ValueError(f"adapter tensor '{name}': not a decoder layer's q/k/v/o/gate/up/down_proj")
    return int(parts[2]), parts[3], parts[4], parts[5][-1]


class AdapterShards:
    """One adapter's shards on this worker, by layer: {layer: {module: (A shard, B shard)}}, the
    scaling, and the version it was committed with. Immutable once built."""

    def __init__(self, held, target):
        self.name, self.version = held["lora_name"], held["version"]
        self.config = {k: held[k] for k in ("r", "lora_alpha", "target_modules")}
        self.scaling = float(held["scaling"])
        pairs = {}
        for name, tensor in held["tensors"].items():
            index, parent, module, part = _module(name)
            pairs.setdefault((index, f"{parent}.{module}.weight"), {})[part] = tensor
        self.layers = {}
        for (index, weight), ab in pairs.items():
            layer, module = target.model.layers[index], weight.split(".")[1]
            a, b = ab["A"], ab["B"]
            # Split as the base weight is: B by its rows, A by its columns (model.Layer.shard_of).
            if module in COLUMN:
                b = layer.shard_of(weight, b)
            elif module in ROW:
                a = layer.shard_of(weight, a)
            else:
                raise ValueError(f"adapter module '{module}' is not adapted by this engine")
            self.layers.setdefault(index, {})[weight] = (a.clone(), b.clone())

    def layer_deltas(self, index, layer):
        """{fused parameter: float64 delta} of layer `index` (this rank's shard of s * B @ A)."""
        out = {}
        for weight, (a, b) in self.layers.get(index, {}).items():
            delta = self.scaling * (b.double() @ a.double())
            if weight.split(".")[1] in ROW:
                out[weight] = delta
                continue
            param, start, size = layer.fused_span(weight)
            if param not in out:
                out[param] = delta.new_zeros(layer.get_parameter(param).shape)
            out[param][start : start + size] += delta
        return out

    def deltas(self, target):
        """Every layer's deltas, computed once when a request starts (it keeps them)."""
        return [self.layer_deltas(i, layer) for i, layer in enumerate(target.model.layers)]

    def describe(self):
        """What /server_info lists of it."""
        return {"lora_name": self.name, "config": self.config, "version": self.version}

    def state(self):
        """The shards as held, for tests: {'<layer>.<module>': (A shard, B shard)}."""
        return {
            f"{i}.{w.split('.')[1]}": (a.clone(), b.clone())
            for i, weights in self.layers.items()
            for w, (a, b) in weights.items()
        }
