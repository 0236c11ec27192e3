# SPDX-License-Identifier: Apache-2.0
"""A simulated board and what runs on it: buffers, kernels, library ops and zoo models."""

import json
import math
import os

import numpy as np

from tpusim import _core
from tpusim.isa import Program, load_program
from tpusim.numerics import from_bf16, to_bf16
from tpusim.presets import config_path

# Device dtypes: name -> (bytes per value, numpy type on the host).
_DTYPES = {
    "float32": (4, np.float32),
    "bfloat16": (2, np.float32),
    "int32": (4, np.int32),
}
_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "i32": "int32"}
# What `run` loads as it is (raw bytes in the array's own type); bf16 is uint16 bit patterns.
_RAW_TYPES = (np.float32, np.int32, np.uint32, np.uint16, np.int16, np.uint8, np.int8)
_RAW_DUMP_TYPES = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4}


def _dtype(dtype, what="dtype") -> str:
    """The device dtype name of `dtype` ('float32', 'bfloat16' or 'int32')."""
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype, dtype)
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = repr(dtype)
    if name not in _DTYPES:
        raise ValueError(f"{what} {name!r}: expected float32, bfloat16 (bf16) or int32")
    return name


def _encode(array, dtype: str) -> bytes:
    """Host values as the device stores them in `dtype`."""
    if dtype == "bfloat16":
        return to_bf16(array).tobytes()
    a = np.asarray(array)
    if dtype == "int32" and a.dtype.kind == "f":
        raise TypeError(f"int32 buffer: got {a.dtype} values; convert them first (np.int32)")
    return np.ascontiguousarray(a, dtype=_DTYPES[dtype][1]).tobytes()


def _decode(data: bytes, dtype: str, shape) -> np.ndarray:
    if dtype == "bfloat16":
        return from_bf16(np.frombuffer(data, dtype=np.uint16)).reshape(shape)
    return np.frombuffer(data, dtype=_DTYPES[dtype][1]).reshape(shape).copy()


def _set_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _path(value, what: str) -> str:
    if value is None:
        return ""
    try:
        return os.fspath(value)
    except TypeError:
        raise TypeError(f"{what}: expected a file path, got {type(value).__name__}") from None


def _float_array(x, what: str, ndim=None) -> np.ndarray:
    """`x` as a C-contiguous float32 array (from any real numeric array), `ndim`-D if given."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"{what}: expected a numeric array, got {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{what}: expected {ndim} dimensions, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{what}: an empty array (shape {a.shape})")
    return np.ascontiguousarray(a, dtype=np.float32)


def _blocks(a: np.ndarray, cores: int):
    """Rows of `a` (its first dimension) in `cores` even shares, the last ones zero-padded as XLA
    pads a sharded dimension: a list of flat float32 blocks, and the share."""
    share = -(-a.shape[0] // cores)
    padded = np.zeros((share * cores,) + a.shape[1:], dtype=np.float32)
    padded[: a.shape[0]] = a
    return [np.ascontiguousarray(b).reshape(-1) for b in np.split(padded, cores)], share


class Result:
    """What a call reports, as the CLI's ``--json`` does.

    Attributes:
        cycles: board cycles of the run (the launches of an op, the model's forward pass or
            training step), from the doorbell to the completion at the host.
        seconds: the same in simulated seconds.
        host_seconds: host (wall-clock) seconds spent simulating it.
        summary: the CLI's ``--json`` result as a dict (plan, utilisation, HBM bytes, ...).
        output: the result values (numpy), for ops; None for models.
        layers: the per-layer table of a model (name, kind, cycles, launches, flops,
            mxu_utilization, hbm_bytes per layer), else an empty list.
        stats: the statistics tree of the board as a dict (``--stats`` writes the same as
            stats.json): every block's counters since the board was opened, and each kernel's
            totals under board.kernels.
    """

    def __init__(self, raw: dict, output=None, kind: str = "run"):
        self.kind = kind
        self.summary = json.loads(raw["summary"])
        self.output = output
        self._stats_json = raw["stats"]
        self._stats = None

    @property
    def cycles(self) -> int:
        return self.summary["cycles"]

    @property
    def seconds(self) -> float:
        return self.summary["simulated_seconds"]

    @property
    def host_seconds(self) -> float:
        return self.summary["host_seconds"]

    @property
    def layers(self) -> list:
        return self.summary.get("layers", [])

    @property
    def stats(self) -> dict:
        if self._stats is None:
            self._stats = json.loads(self._stats_json)
        return self._stats

    def __repr__(self) -> str:
        shape = "" if self.output is None else f", output {self.output.shape}"
        return f"<tpusim.Result {self.kind}: {self.cycles} cycles{shape}>"


class RunResult(Result):
    """What :meth:`Board.run` reports: cycles, per-core figures and the dumped memory.

    Attributes (besides Result's):
        outputs: the ``dumps``, name -> numpy array.
        cores: per launched core: id, cycles, instructions, hbm_read_bytes, hbm_write_bytes.
        mxu_utilization: useful MACs over the launched cores' MXU peak for the run's cycles.
    """

    def __init__(self, raw: dict, outputs: dict):
        super().__init__(raw, kind="run")
        self.outputs = outputs

    @property
    def cores(self) -> list:
        return self.summary["cores"]

    @property
    def mxu_utilization(self) -> float:
        return self.summary["mxu_utilization"]

    def __repr__(self) -> str:
        return f"<tpusim.RunResult {self.cycles} cycles, outputs {sorted(self.outputs)}>"


class Buffer:
    """A typed array in one core's HBM (Board.alloc / Board.upload). Transfers are timed on the
    host link of the core's chip, as the driver does."""

    def __init__(self, board, raw, shape, dtype):
        self._board, self._raw = board, raw
        self.shape, self.dtype = tuple(shape), dtype

    core = property(lambda self: self._raw.core, doc="the core whose HBM holds it")
    addr = property(lambda self: self._raw.addr, doc="byte address in that HBM")
    nbytes = property(lambda self: self._raw.bytes, doc="size in bytes")

    def write(self, array) -> None:
        """Copies `array` (the buffer's shape) to the device, converting to its dtype (bf16:
        rounded to nearest even)."""
        a = np.asarray(array)
        if a.shape != self.shape:
            raise ValueError(f"buffer write: shape {a.shape}, the buffer holds {self.shape}")
        self._board._check_open().write(self._raw, _encode(a, self.dtype), 0)

    def read(self) -> np.ndarray:
        """The buffer's values (a host sync): float32 for float32 and bfloat16, int32 for int32."""
        data = self._board._check_open().read(self._raw, self.nbytes, 0)
        return _decode(data, self.dtype, self.shape)

    def free(self) -> None:
        """Returns the memory to the core's allocator."""
        self._board._check_open().free(self._raw)

    def __repr__(self) -> str:
        return (f"<tpusim.Buffer {self.dtype}{list(self.shape)} on core {self.core} "
                f"at 0x{self.addr:x}>")


class Board:
    """A simulated board: the built-in v3-8-like one (8 cores), a preset by name
    (``tpusim.presets()``: "v3-8", "tiny", "v3-32", ...) or a JSON config path, with ``set``
    overriding config fields as ``--set`` does (``{"sim.functional": False}``).

    A board keeps its simulated time, memory and statistics across calls; every op and model
    measures its own cycles. Close it (or use ``with``) to free the simulation. A device
    fault ends that board; open a new one (in the same process) to run again.
    """

    def __init__(self, config=None, set=None):  # noqa: A002 (the CLI's --set)
        sets = []
        for key, value in (set or {}).items():
            if not isinstance(key, str):
                raise TypeError(f"set: keys are config paths (str), got {key!r}")
            sets.append(f"{key}={_set_value(value)}")
        if config is not None and not isinstance(config, (str, os.PathLike)):
            raise TypeError(f"config: expected a preset name or a path, got {type(config).__name__}")
        self._board = _core.Board(config_path(config), sets)

    # ---- the board ----------------------------------------------------------------------

    def close(self) -> None:
        """Ends the simulation; any later call raises ValueError."""
        self._board.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self):
        if self._board.closed:
            raise ValueError("the board is closed")
        return self._board

    @property
    def num_cores(self) -> int:
        return self._check_open().num_cores

    @property
    def clock_mhz(self) -> float:
        return self._check_open().clock_mhz

    @property
    def cycle(self) -> int:
        """The current board cycle (simulated time since the board was opened)."""
        return self._check_open().cycle

    @property
    def config(self) -> dict:
        """The effective config (what ``--stats`` writes beside the statistics)."""
        return json.loads(self._check_open().config_json())

    def stats(self) -> dict:
        """The statistics tree now (stats.json), with each kernel's totals."""
        return json.loads(self._check_open().stats_json())

    def cores(self, cores) -> list:
        """Core numbers from an int, a list, or the CLI's text ("0-3", "1,5", "all")."""
        if isinstance(cores, str):
            text = cores
        elif isinstance(cores, (bool, np.bool_)):
            raise TypeError("cores: expected a core number, a list of them or a core list text")
        elif isinstance(cores, (int, np.integer)):
            text = str(int(cores))
        else:
            try:
                text = ",".join(str(int(c)) for c in cores)
            except TypeError:
                raise TypeError(f"cores: expected a core number, a list of them or a core "
                                f"list text, got {type(cores).__name__}") from None
        try:
            return _core.parse_cores(text, self.num_cores)
        except ValueError as e:
            raise ValueError(f"cores: {e}") from None

    def __repr__(self) -> str:
        if self._board.closed:
            return "<tpusim.Board (closed)>"
        return f"<tpusim.Board {self.config['name']}: {self.num_cores} cores, cycle {self.cycle}>"

    # ---- buffers ------------------------------------------------------------------------

    def alloc(self, shape, dtype="float32", core: int = 0) -> Buffer:
        """An uninitialised buffer of `shape` and `dtype` (float32, bfloat16, int32) in the HBM
        of `core`."""
        dtype = _dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        if any(s <= 0 for s in shape):
            raise ValueError(f"alloc: shape {shape} has a size that is not positive")
        nbytes = math.prod(shape) * _DTYPES[dtype][0]
        return Buffer(self, self._check_open().alloc(nbytes, int(core)), shape, dtype)

    def upload(self, array, dtype=None, core: int = 0) -> Buffer:
        """A buffer holding `array` on `core` (a timed host-to-device transfer). `dtype`
        defaults to the array's (float32 or int32; other floats become float32); "bfloat16"
        rounds to nearest even."""
        a = np.asarray(array)
        if dtype is None:
            dtype = "int32" if a.dtype.kind in "iu" else "float32"
        buf = self.alloc(a.shape, dtype, core)
        buf.write(a)
        return buf

    # ---- kernels ------------------------------------------------------------------------

    def run(self, program, cores=0, loads=None, dumps=None, args=(), *, trace=None, stats=None,
            trace_units=None, trace_window=None) -> RunResult:
        """Runs a kernel as ``tpusim run`` does.

        Args:
            program: a :class:`tpusim.Program` (``tpusim.assemble``) or a kernel file (.s or a
                program image).
            cores: the cores to launch on (``board.cores`` forms).
            loads: ``{where: array}`` copied into memory before the run (untimed, as a loader
                does). ``where`` is an address (the HBM of every launched core), ``(cores,
                addr)`` or ``(cores, "hbm" | "vmem", addr)``. The array's bytes are loaded as
                they are: float32, int32, uint16 (bf16 bit patterns: ``tpusim.to_bf16(a)``),
                or 8-bit values.
            dumps: ``{name: (where, dtype, shape)}`` read back after the run into
                ``result.outputs[name]``; ``where`` names one core (an address alone: the first
                launched core); dtype float32, bfloat16 (returned as float32), int32, or a raw
                uint8/int8/uint16/int16/uint32.
            args: launch arguments, placed in s1, s2, ...
            trace, stats, trace_units, trace_window: as the CLI's --trace, --stats, ...

        Raises DeviceError for a fault or deadlock (naming the core, pc and instruction).
        """
        board = self._check_open()
        if isinstance(program, Program):
            source = program.name or "kernel"
        elif isinstance(program, (str, os.PathLike)):
            source = os.fspath(program)
            program = load_program(program)
        else:
            raise TypeError(f"program: expected a tpusim.Program or a kernel file, "
                            f"got {type(program).__name__}")
        launched = self.cores(cores)
        try:
            arg_list = [int(a) for a in args]
        except (TypeError, ValueError):
            raise TypeError("args: expected a list of integers") from None
        if any(not 0 <= a < 2**32 for a in arg_list):
            raise ValueError("args: each argument must fit in 32 bits unsigned")
        load_regions = []
        for where, array in _items(loads, "loads"):
            r = self._region(where, launched, f"loads[{where!r}]", one_core=False)
            if isinstance(array, (bytes, bytearray)):
                r.data = bytes(array)
            else:
                a = np.asarray(array)
                if a.dtype.type not in _RAW_TYPES:
                    raise TypeError(
                        f"loads[{where!r}]: {a.dtype} values; load float32, int32, uint16 bf16 "
                        "bit patterns (tpusim.to_bf16) or 8-bit values")
                r.data = np.ascontiguousarray(a).tobytes()
            load_regions.append(r)
        dump_regions, dump_specs = [], []
        for name, spec in _items(dumps, "dumps"):
            try:
                where, dtype, shape = spec
            except (TypeError, ValueError):
                raise TypeError(f"dumps[{name!r}]: expected (where, dtype, shape)") from None
            if isinstance(dtype, str) and dtype in _RAW_DUMP_TYPES:
                size = _RAW_DUMP_TYPES[dtype]
            else:
                dtype = _dtype(dtype, f"dumps[{name!r}]: dtype")
                size = _DTYPES[dtype][0]
            shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
            r = self._region(where, launched, f"dumps[{name!r}]", one_core=True)
            r.bytes = math.prod(shape) * size
            dump_regions.append(r)
            dump_specs.append((name, dtype, shape))
        raw = board.run(program, source, launched, load_regions, dump_regions, arg_list,
                        _outputs(trace, stats, trace_units, trace_window))
        outputs = {}
        for (name, dtype, shape), data in zip(dump_specs, raw["dumps"]):
            if dtype in _RAW_DUMP_TYPES:
                outputs[name] = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
            else:
                outputs[name] = _decode(data, dtype, shape)
        return RunResult(raw, outputs)

    def _region(self, where, launched, label, one_core):
        r = _core.Region()
        r.label = label
        if isinstance(where, (int, np.integer)) and not isinstance(where, bool):
            cores, memory, addr = launched[:1] if one_core else launched, "hbm", where
        elif isinstance(where, tuple) and len(where) in (2, 3):
            cores, memory, addr = (where[0], "hbm", where[1]) if len(where) == 2 else where
            cores = self.cores(cores)
        else:
            raise TypeError(f"{label}: expected an address, (cores, addr) or "
                            "(cores, 'hbm' | 'vmem', addr)")
        if memory not in ("hbm", "vmem"):
            raise ValueError(f"{label}: memory {memory!r} must be 'hbm' or 'vmem'")
        if one_core and len(cores) != 1:
            raise ValueError(f"{label}: a dump names one core")
        if not isinstance(addr, (int, np.integer)) or addr < 0:
            raise TypeError(f"{label}: the address must be a non-negative integer")
        r.cores, r.hbm, r.addr = cores, memory == "hbm", int(addr)
        return r

    # ---- library ops --------------------------------------------------------------------

    def gemm(self, a, w, *, precision="bf16", cores=0, trace=None, stats=None,
             trace_units=None, trace_window=None) -> Result:
        """C = A W with the library GEMM (``tpusim gemm``): A (M x K) and W (K x N) as fp32,
        multiplied in `precision` ("bf16": one MXU pass on bf16-rounded operands; "fp32-3pass",
        "fp32-6pass": fp32 split into bf16 parts), accumulated in fp32, the work split over
        `cores`. ``result.output`` is C (M x N, float32)."""
        a, w = _float_array(a, "gemm a", 2), _float_array(w, "gemm w", 2)
        if a.shape[1] != w.shape[0]:
            raise ValueError(f"gemm: a is {a.shape} and w is {w.shape}: a's columns must equal "
                             "w's rows")
        (m, k), n = a.shape, w.shape[1]
        raw = self._check_open().gemm(a, w, m, k, n, precision, self.cores(cores),
                                      _outputs(trace, stats, trace_units, trace_window))
        return Result(raw, raw["output"].reshape(m, n), "gemm")

    def conv2d(self, x, w, bias=None, *, stride=1, pad=0, cores=0, trace=None, stats=None,
               trace_units=None, trace_window=None) -> Result:
        """y = conv2d(x, w) + bias (``tpusim op conv2d``): x NHWC (N, H, W, Cin), w HWIO (k, k,
        Cin, Cout), bias (Cout,) or None (zeros); bf16 operands, fp32 accumulation; the images
        data-parallel over `cores`. ``result.output`` is y (N, Ho, Wo, Cout)."""
        x, w = _float_array(x, "conv2d x", 4), _float_array(w, "conv2d w", 4)
        if w.shape[0] != w.shape[1]:
            raise ValueError(f"conv2d: w is {w.shape}: the kernel must be square (k, k, Cin, Cout)")
        if w.shape[2] != x.shape[3]:
            raise ValueError(f"conv2d: x has {x.shape[3]} channels (NHWC), w expects {w.shape[2]} "
                             "(HWIO)")
        cout = w.shape[3]
        b = np.zeros(cout, np.float32) if bias is None else _float_array(bias, "conv2d bias", 1)
        if b.shape != (cout,):
            raise ValueError(f"conv2d: bias has shape {b.shape}, expected ({cout},)")
        stride, pad = _count(stride, "stride", 1), _count(pad, "pad", 0)
        n, h, wd, cin = x.shape
        k = w.shape[0]
        raw = self._check_open().conv2d(x, w, b, [n, h, wd, cin, cout, k, stride, pad],
                                        self.cores(cores),
                                        _outputs(trace, stats, trace_units, trace_window))
        ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
        return Result(raw, raw["output"].reshape(n, ho, wo, cout), "conv2d")

    def layernorm(self, x, gamma=None, beta=None, *, cores=0, trace=None, stats=None,
                  trace_units=None, trace_window=None) -> Result:
        """Layer normalisation over the last dimension of x (``tpusim op layernorm``), fp32,
        eps = 1e-5 (PyTorch's default); gamma and beta default to ones and zeros; the rows
        data-parallel over `cores` in even, zero-padded shares. ``result.output`` has x's
        shape."""
        x = _float_array(x, "layernorm x")
        cols = x.shape[-1]
        g = np.ones(cols, np.float32) if gamma is None else _float_array(gamma, "layernorm gamma")
        b = np.zeros(cols, np.float32) if beta is None else _float_array(beta, "layernorm beta")
        for name, v in (("gamma", g), ("beta", b)):
            if v.shape != (cols,):
                raise ValueError(f"layernorm: {name} has shape {v.shape}, expected ({cols},)")
        rows2d = x.reshape(-1, cols)
        launched = self.cores(cores)
        blocks, _ = _blocks(rows2d, len(launched))
        raw = self._check_open().layernorm(blocks, g, b, rows2d.shape[0], cols, launched,
                                           _outputs(trace, stats, trace_units, trace_window))
        return Result(raw, raw["output"][: rows2d.size].reshape(x.shape), "layernorm")

    def softmax(self, x, *, cores=0, trace=None, stats=None, trace_units=None,
                trace_window=None) -> Result:
        """Softmax over the last dimension of x (``tpusim op softmax``), fp32, numerically
        stable; rows data-parallel over `cores`. ``result.output`` has x's shape."""
        x = _float_array(x, "softmax x")
        cols = x.shape[-1]
        rows2d = x.reshape(-1, cols)
        launched = self.cores(cores)
        blocks, _ = _blocks(rows2d, len(launched))
        raw = self._check_open().softmax(blocks, rows2d.shape[0], cols, launched,
                                         _outputs(trace, stats, trace_units, trace_window))
        return Result(raw, raw["output"][: rows2d.size].reshape(x.shape), "softmax")

    def attention(self, q, k, v, *, causal=False, cores=0, trace=None, stats=None,
                  trace_units=None, trace_window=None) -> Result:
        """Multi-head scaled dot-product attention (``tpusim op attention``): q, k and v of
        shape (batch, heads, seq, dhead); softmax(q kᵀ / sqrt(dhead) [+ causal mask]) v with
        bf16 MXU contractions and an fp32 softmax; sequences data-parallel over `cores`.
        ``result.output`` has q's shape."""
        q = _float_array(q, "attention q", 4)
        k, v = _float_array(k, "attention k", 4), _float_array(v, "attention v", 4)
        if not q.shape == k.shape == v.shape:
            raise ValueError(f"attention: q {q.shape}, k {k.shape} and v {v.shape} must have "
                             "one shape (batch, heads, seq, dhead)")
        batch, heads, seq, dhead = q.shape
        launched = self.cores(cores)
        blocks = [_blocks(t, len(launched))[0] for t in (q, k, v)]
        raw = self._check_open().attention(*blocks, [batch, heads, seq, dhead], bool(causal),
                                           launched,
                                           _outputs(trace, stats, trace_units, trace_window))
        return Result(raw, raw["output"][: q.size].reshape(q.shape), "attention")

    def allreduce(self, x, *, cores=None, trace=None, stats=None, trace_units=None,
                  trace_window=None) -> Result:
        """The ring all-reduce (sum) over ICI (``tpusim op allreduce``): row i of x (cores x
        n) is the vector of the i-th core of `cores` (default 0, 1, ...). ``result.output``
        holds every core's result (cores x n), each bit-identical."""
        x = _float_array(x, "allreduce x", 2)
        if x.shape[0] < 2:
            raise ValueError("allreduce: needs at least two cores; one alone has nothing to "
                             "reduce with")
        launched = self.cores(range(x.shape[0]) if cores is None else cores)
        if len(launched) != x.shape[0]:
            raise ValueError(f"allreduce: x has {x.shape[0]} rows for {len(launched)} cores")
        raw = self._check_open().allreduce(list(x), launched,
                                           _outputs(trace, stats, trace_units, trace_window))
        return Result(raw, raw["output"].reshape(x.shape), "allreduce")

    # ---- models -------------------------------------------------------------------------

    def model(self, name, *, batch=1, cores=0, train_step=False, precision="bf16-mixed",
              image=None, hidden=None, heads=None, seq=None, ffn=None, layers=None, vocab=None,
              seed=None, trace=None, stats=None, trace_units=None, trace_window=None) -> Result:
        """One inference (or with ``train_step`` one training step: forward, backward, gradient
        all-reduce, Adam) of a zoo model (``tpusim model``; ``tpusim.models()`` lists them),
        `batch` examples data-parallel over `cores`, in `precision` ("32-true", "bf16-mixed",
        "bf16-true"). Sizes left None take the model's defaults. ``result.layers`` is the
        per-layer table; ``result.cycles`` the forward pass or the step."""
        if not isinstance(name, str):
            raise TypeError(f"model: expected a model name, got {type(name).__name__}")
        sizes = {}
        for key, value in (("image", image), ("hidden", hidden), ("heads", heads), ("seq", seq),
                           ("ffn", ffn), ("layers", layers), ("vocab", vocab), ("seed", seed)):
            if value is not None:
                sizes[key] = _count(value, key, 0 if key == "seed" else 1)
        raw = self._check_open().model(name, sizes, _count(batch, "batch", 1), self.cores(cores),
                                       bool(train_step), precision,
                                       _outputs(trace, stats, trace_units, trace_window))
        return Result(raw, kind=f"model {name}")


def _items(mapping, what):
    if mapping is None:
        return []
    if isinstance(mapping, dict):
        return list(mapping.items())
    try:
        return [(k, v) for k, v in mapping]
    except (TypeError, ValueError):
        raise TypeError(f"{what}: expected a dict or a list of pairs") from None


def _count(value, what, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: expected an integer, got {type(value).__name__}")
    if value < minimum or value >= 2**32:
        raise ValueError(f"{what}: expected a whole number >= {minimum}, got {value}")
    return int(value)


def _outputs(trace, stats, trace_units, trace_window):
    o = _core.Outputs()
    o.trace, o.stats = _path(trace, "trace"), _path(stats, "stats")
    o.trace_units = "" if trace_units is None else str(trace_units)
    o.trace_window = "" if trace_window is None else str(trace_window)
    return o
