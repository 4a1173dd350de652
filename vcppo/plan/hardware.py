"""GPU datasheet figures for `vcppo plan`: memory, dense peaks per dtype, memory and link bandwidths
(the models' shapes: :mod:`vcppo.models.shapes`)."""
from __future__ import annotations

from dataclasses import dataclass

GiB = 2 ** 30


@dataclass(frozen=True)
class Hardware:
    """One accelerator: memory, dense matmul peak per dtype, memory bandwidth and the bandwidth of its
    links to the other GPUs of its node and of other nodes (datasheets).

    ``memory_bytes`` is what the device reports as its total (vLLM's ``gpu_memory_utilization`` is a
    share of it); ``reserve_bytes`` is left out of what the planner fills (CUDA context, NCCL
    buffers, allocator fragmentation: a rough allowance, not a measured figure)."""
    name: str
    memory_bytes: int
    flops_bf16: float       # dense FLOP/s, tensor cores
    flops_fp32: float       # FLOP/s without tensor cores (torch's default fp32 matmul)
    bandwidth: float        # bytes/s of HBM (or DRAM)
    reserve_bytes: int
    is_cpu: bool = False
    node_link: float = 450e9      # bytes/s one GPU sends to the others of its node (NVLink, per direction)
    network_link: float = 50e9    # bytes/s one GPU sends to other nodes (its InfiniBand adapter, per direction)

    @property
    def usable_bytes(self) -> int:
        return self.memory_bytes - self.reserve_bytes

    def flops(self, dtype_bytes: int) -> float:
        return self.flops_fp32 if dtype_bytes >= 4 else self.flops_bf16


# NVIDIA datasheets (SXM parts): H100 80 GB: 989 TFLOP/s bf16 dense, 67 TFLOP/s fp32, 3.35 TB/s;
# H200 141 GB: same compute, 4.8 TB/s; A100 80 GB: 312 TFLOP/s bf16, 19.5 fp32, 2.0 TB/s. Totals
# are what nvidia-smi reports (81559 MiB, 143771 MiB, 81920 MiB). cpu24 is this project's 2-core
# CI machine treated as a 24 GiB "device": its figures are rough guesses of the right order
# (2 cores x AVX2 FMA, one DDR channel's worth of bandwidth), for the CPU demo scale only.
# Links, per GPU and per direction: NVLink 4 (H100 and H200 SXM) 900 GB/s bidirectional = 450 GB/s,
# NVLink 3 (A100 SXM) 600 GB/s = 300 GB/s (NVIDIA datasheets); across nodes one InfiniBand adapter
# per GPU as in a DGX: ConnectX-7 NDR 400 Gb/s = 50 GB/s (DGX H100 / H200), ConnectX-6 HDR 200 Gb/s =
# 25 GB/s (DGX A100). cpu24's ranks exchange through gloo in one host's memory: a guess of the
# same order as its DRAM figure, and it has no second node.
HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", 81559 * 2 ** 20, 989e12, 67e12, 3.35e12, int(1.5 * GiB), node_link=450e9,
                     network_link=50e9),
    "h200": Hardware("h200", 143771 * 2 ** 20, 989e12, 67e12, 4.8e12, int(1.5 * GiB), node_link=450e9,
                     network_link=50e9),
    "a100": Hardware("a100", 81920 * 2 ** 20, 312e12, 19.5e12, 2.0e12, int(1.5 * GiB), node_link=300e9,
                     network_link=25e9),
    "cpu24": Hardware("cpu24", 24 * GiB, 0.1e12, 0.1e12, 20e9, 4 * GiB, is_cpu=True, node_link=10e9,
                      network_link=10e9),
}


def dtype_bytes(dtype: str, hardware: Hardware) -> int:
    """Bytes per element of ``model.dtype``; 'auto' is bf16 on a GPU, fp32 on CPU (as the engines
    resolve it: vcppo.engines.engine_setup.resolve_dtype)."""
    if dtype == "auto":
        return 4 if hardware.is_cpu else 2
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
