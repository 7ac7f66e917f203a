"""The capacity and compute plan of a run: whether a preset fits a machine's GPUs, host RAM and disk, and what it
costs in GPU-hours (``python -m unifiedplayers.capacity experiment=NAME``; docs/capacity.md). :func:`plan` makes it,
:func:`check_fits` refuses at start-up a run that does not fit. The names callers use are re-exported here.
"""
from unifiedplayers.capacity.arch import ARCH_DIR, Arch, UnknownArchitecture, arch_file, arch_from_config, model_arch
from unifiedplayers.capacity.compute import (CPU_ADAM_PARAMS_PER_S, DISK_WRITE_BYTES_PER_S, GPU_LINK_BYTES_PER_S,
                                             PCIE_BYTES_PER_S, RoleCompute, bank_scorings_per_update)
from unifiedplayers.capacity.concurrent import Need, run_need, runs_that_fit
from unifiedplayers.capacity.disk import checkpoint_disk
from unifiedplayers.capacity.fits import CapacityError, check_fits
from unifiedplayers.capacity.hardware import Hardware, hardware_here, node_here
from unifiedplayers.capacity.memory import Instant, Item, device_instants
from unifiedplayers.capacity.run_plan import PAPER_GPU_HOURS, Plan, plan
from unifiedplayers.capacity.units import GB, TB, GiB, count
from unifiedplayers.capacity.workload import (RoleLoad, Setup, Stage, busiest_rank_rows, micro_rows, phase_stages,
                                              role_loads, setup_of)
