"""Point-to-point transport between pipeline stages: tensors cross as packed uint8 payloads.

A message is a fixed-size int64 header (magic, codec id, dtype, shape, payload bytes) followed by
the uint8 payload a ``WireCodec`` produced. Because the payload is bytes, compressed activations
(BFP, integer codes) cross stages as easily as fp32 ones; torch's own pipelining forces
``requires_grad`` on boundary tensors and cannot.

One ``torch.distributed`` message per tensor: gloo moves a message only once its receive is posted,
and every message costs both ends a hand-shake, so the receiver posts, at the start of a step, a
receive big enough for the header and the payload the same slot (peer, tag) carried last time (a
schedule repeats its messages every step); ``SlotSizes`` remembers those sizes on both ends. The
sender puts the header and up to that capacity of payload in one message (padded to the capacity
when the payload is shorter) and anything beyond it in a second message on the overflow tag, which
the receiver posts once the header tells it the size. Both ends update their tables with the same sizes
in the same order, so their capacities always agree; a slot's first message carries the header only.

The same code runs on CPU with gloo and on CUDA with NCCL. Messages live on ``wire_device()``
(the current GPU under NCCL, the CPU under gloo): a codec encodes on the tensor's own device and
only the finished payload moves to the wire device, and a receiver moves the payload to the device
it computes on before decoding. NCCL needs two more things gloo does not: a receive as long as the
message (so a message shorter than the slot's capacity is padded to it), and messages between two
ranks matched by their order rather than their tag; ``Channel`` gives each kind of sequence (one
direction, or its overflows) a process group of its own, so that each stays in order and an early
receive in one direction never holds up a send in the other (NCCL runs one group's transfers to a
peer one after another).

Invariant: a receive returns exactly the tensor the codec decodes from the bytes that were sent
(for ``Fp32Codec``: the sent tensor, bit for bit); every wait is bounded by ``timeout_s``.
Sends are ``isend``: they never block the sender, which is what the schedule simulator assumes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

HEADER_LEN = 12
HEADER_BYTES = HEADER_LEN * 8
MAX_DIMS = HEADER_LEN - 5
_MAGIC = 0x7E1D
_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]
KIND_ACTIVATION, KIND_GRADIENT, KIND_EVAL = 0, 1, 2


class WireCodec(Protocol):
    """Turns a tensor into bytes and back. ``decode`` receives the original shape and dtype from the
    header, so a codec need not describe itself (a self-describing one may ignore them)."""

    codec_id: int
    name: str

    def encode(self, tensor: torch.Tensor) -> torch.Tensor: ...  # -> 1-D uint8

    def decode(self, payload: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor: ...


class Fp32Codec:
    """The identity codec: the tensor's own bytes (lossless)."""

    codec_id = 0
    name = "fp32"

    def encode(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().contiguous().view(-1).view(torch.uint8)

    def decode(self, payload: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return payload.view(dtype).view(shape).clone()


_CODECS: dict[int, WireCodec] = {Fp32Codec.codec_id: Fp32Codec()}


def register_codec(codec: WireCodec) -> None:
    """Make a codec decodable on this rank (every rank must register the same codecs)."""
    existing = _CODECS.get(codec.codec_id)
    if existing is not None and existing.name != codec.name:
        raise ValueError(f"codec id {codec.codec_id} already names {existing.name!r}")
    _CODECS[codec.codec_id] = codec


def codec_by_name(name: str) -> WireCodec:
    for codec in _CODECS.values():
        if codec.name == name:
            return codec
    raise ValueError(f"unknown wire codec {name!r}; registered: {sorted(c.name for c in _CODECS.values())}")


def message_tag(kind: int, microbatch: int) -> int:
    """The message's tag; its overflow uses tag + 1. Distinct per (kind, microbatch) within a step."""
    return (microbatch * 3 + kind) * 2


def wire_device() -> torch.device:
    """Where this rank's messages and collective buffers must live: NCCL moves CUDA tensors only,
    gloo's point-to-point transfers CPU tensors only (and a single stage without a process group
    sends nothing)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass(frozen=True)
class Channel:
    """The process groups one sequence of messages travels on (the messages, and their overflows;
    None: the default group, enough for gloo, which matches by tag; see the module docstring), and
    the device its buffers live on (``wire_device()``, looked up once: each send and receive would
    pay for the lookup)."""

    group: dist.ProcessGroup | None = None
    overflow: dist.ProcessGroup | None = None
    device: torch.device = torch.device("cpu")


@dataclass(frozen=True)
class Channels:
    """One ``Channel`` per direction: toward later stages (activations, evaluation outputs) and
    toward earlier ones (input gradients)."""

    forward: Channel = Channel()
    backward: Channel = Channel()

    @classmethod
    def default(cls) -> Channels:
        """Both directions on the default group, on this rank's wire device (enough for gloo)."""
        device = wire_device()
        return cls(Channel(device=device), Channel(device=device))

    @classmethod
    def create(cls, stages: Sequence[Sequence[int]]) -> Channels:
        """Four groups of every rank, each opened between neighbouring stages' ranks (``stages``:
        the ranks of each stage). Collective: every rank calls it, in the same order.

        Opening: one byte from each rank to each rank of the next stage, pair by pair in one
        global order. NCCL builds a pair's communicator at its first transfer and both ends wait
        for it; left to the first step, stage 0 would wait on the gradient group while the last
        stage waits on the activation group, each for the other."""
        world = list(range(dist.get_world_size()))
        groups = [dist.new_group(world) for _ in range(4)]
        pairs = sorted((a, b) for first, then in itertools.pairwise(stages) for a in first for b in then)
        device = wire_device()
        rank, token = dist.get_rank(), torch.zeros(1, dtype=torch.uint8, device=device)
        for group in groups:
            for a, b in pairs:
                if rank == a:
                    dist.send(token, b, group=group)
                elif rank == b:
                    dist.recv(token, a, group=group)
        fwd, fwd_overflow, bwd, bwd_overflow = groups
        return cls(Channel(fwd, fwd_overflow, device), Channel(bwd, bwd_overflow, device))


DEFAULT_CHANNEL = Channel()  # the default group, CPU buffers: what gloo needs


class SlotSizes:
    """Payload bytes last carried per (peer rank, tag): the capacity of the next eager receive.
    A sender and its receiver each keep one and update it with the same sizes."""

    def __init__(self) -> None:
        self._sizes: dict[tuple[int, int], int] = {}

    def capacity(self, peer: int, tag: int) -> int:
        return self._sizes.get((peer, tag), 0)

    def record(self, peer: int, tag: int, n_bytes: int) -> None:
        self._sizes[(peer, tag)] = n_bytes


def pack_header(codec: WireCodec, tensor: torch.Tensor, n_bytes: int) -> torch.Tensor:
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"at most {MAX_DIMS} dimensions cross a stage boundary")
    shape = list(tensor.shape) + [0] * (MAX_DIMS - tensor.dim())
    return torch.tensor(
        [_MAGIC, codec.codec_id, _DTYPES.index(tensor.dtype), tensor.dim(), *shape, n_bytes],
        dtype=torch.int64,
    )


Header = tuple[WireCodec, torch.dtype, tuple[int, ...], int]  # codec, dtype, shape, payload bytes


def unpack_header(header: torch.Tensor) -> Header:
    values = header.tolist()
    if values[0] != _MAGIC:
        raise ValueError(f"bad header magic {values[0]:#x}: peers disagree on the message order")
    ndim = values[3]
    return _CODECS[values[1]], _DTYPES[values[2]], tuple(values[4 : 4 + ndim]), values[-1]


@dataclass
class PendingSends:
    """Sends in flight; keeps their buffers alive until waited."""

    works: list[dist.Work] = field(default_factory=list)
    buffers: list[torch.Tensor] = field(default_factory=list)
    bytes_sent: int = 0  # headers, payloads and padding
    payload_bytes: int = 0  # what the codecs produced
    raw_bytes: int = 0  # what the same tensors take uncompressed (the fp32 codec's payload)

    def wait_all(self, timeout_s: float) -> None:
        for work in self.works:
            work.wait(timedelta(seconds=timeout_s))
        self.works.clear()
        self.buffers.clear()


def _posted(work: dist.Work | None) -> dist.Work:
    """An ``isend``/``irecv``'s handle; torch returns None on a rank outside the default group."""
    if work is None:
        raise RuntimeError("point-to-point transfer on a rank outside the default process group")
    return work


def send_tensor(
    tensor: torch.Tensor,
    dst: int,
    tag: int,
    codec: WireCodec,
    pending: PendingSends,
    sizes: SlotSizes | None = None,
    channel: Channel = DEFAULT_CHANNEL,
) -> None:
    wire = channel.device
    payload = codec.encode(tensor).to(wire)  # a no-op unless gloo carries a GPU rank's tensors
    n_bytes = payload.numel()
    capacity = sizes.capacity(dst, tag) if sizes is not None else 0
    parts = [pack_header(codec, tensor, n_bytes).view(torch.uint8).to(wire), payload[:capacity]]
    if n_bytes < capacity:  # padded to the receive (see the module docstring)
        parts.append(torch.zeros(capacity - n_bytes, dtype=torch.uint8, device=wire))
    message = torch.cat(parts)
    pending.works.append(_posted(dist.isend(message, dst, group=channel.group, tag=tag)))
    pending.buffers.append(message)
    if n_bytes > capacity:
        overflow = payload[capacity:]
        pending.works.append(_posted(dist.isend(overflow, dst, group=channel.overflow, tag=tag + 1)))
        pending.buffers.append(overflow)
    if sizes is not None:
        sizes.record(dst, tag, n_bytes)
    pending.bytes_sent += message.numel() + max(0, n_bytes - capacity)
    pending.payload_bytes += n_bytes
    pending.raw_bytes += tensor.numel() * tensor.element_size()


class PendingRecv:
    """A receive posted early, for the header and the slot's expected payload; an overflow is posted
    as soon as the header shows one."""

    def __init__(
        self, src: int, tag: int, sizes: SlotSizes | None = None, channel: Channel = DEFAULT_CHANNEL
    ):
        self.src, self.tag, self.sizes, self.channel = src, tag, sizes, channel
        self.capacity = sizes.capacity(src, tag) if sizes is not None else 0
        self.message = torch.empty(HEADER_BYTES + self.capacity, dtype=torch.uint8, device=channel.device)
        self.work = _posted(dist.irecv(self.message, src, group=channel.group, tag=tag))
        self.overflow: tuple[torch.Tensor, dist.Work] | None = None  # its buffer and receive, if any
        self.meta: Header | None = None

    def _read_header(self) -> Header:
        # On a GPU this copies 96 bytes to the host and waits for them: the sizes decide what to
        # receive next, so they cannot stay on the device.
        meta = self.meta = unpack_header(self.message[:HEADER_BYTES].view(torch.int64))
        n_bytes = meta[3]
        if self.sizes is not None:
            self.sizes.record(self.src, self.tag, n_bytes)
        if n_bytes > self.capacity:
            buffer = torch.empty(n_bytes - self.capacity, dtype=torch.uint8, device=self.message.device)
            work = dist.irecv(buffer, self.src, group=self.channel.overflow, tag=self.tag + 1)
            self.overflow = (buffer, _posted(work))
        return meta

    def poll(self) -> None:
        """Read the header if the message is in, so that an overflow transfer overlaps compute."""
        if self.meta is None and self.work.is_completed():
            self.work.wait()
            self._read_header()

    def wait(self, timeout_s: float, device: torch.device | None = None) -> torch.Tensor:
        """The decoded tensor, on ``device`` (default: the wire device), decoded there."""
        meta = self.meta
        if meta is None:
            self.work.wait(timedelta(seconds=timeout_s))
            meta = self._read_header()
        codec, dtype, shape, n_bytes = meta
        inline = self.message[HEADER_BYTES : HEADER_BYTES + min(n_bytes, self.capacity)]
        if self.overflow is None:
            payload = inline
        else:
            buffer, work = self.overflow
            work.wait(timedelta(seconds=timeout_s))
            payload = torch.cat([inline, buffer])
        # The payload, not the decoded tensor, crosses to the compute device: it is the smaller one.
        return codec.decode(payload.to(device or payload.device), shape, dtype)


def measure_bandwidth(n_bytes: int = 4 << 20, rounds: int = 3) -> float:
    """Bytes per second between ranks 0 and 1 (ping-pong); every rank must call it. 1 rank: inf."""
    if dist.get_world_size() < 2:
        return float("inf")
    buffer = torch.zeros(n_bytes, dtype=torch.uint8, device=wire_device())
    rank, best = dist.get_rank(), float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        if rank == 0:
            dist.send(buffer, 1)
            dist.recv(buffer, 1)
        elif rank == 1:
            dist.recv(buffer, 0)
            dist.send(buffer, 0)
        float(buffer[0])  # under NCCL the transfers are asynchronous to the host: wait for them
        best = min(best, time.perf_counter() - start)
    result = torch.tensor(
        [2 * n_bytes / best if rank == 0 else 0.0], dtype=torch.float64, device=buffer.device
    )
    dist.broadcast(result, 0)
    return float(result.item())
