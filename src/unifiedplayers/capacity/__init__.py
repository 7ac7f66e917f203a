"""The capacity and compute plan of a run: whether a preset fits a machine's GPUs, host RAM and disk, and what it
costs in GPU-hours, before anything is spent::

    python -m unifiedplayers.capacity experiment=paper_qwen3_4b [overrides] [--gpus 8 --nodes 1 --gpu-memory-gb 80 ...]

The plan reads the model's configuration, never its weights (``model.path`` may be a hub id out of reach): a local
``model.path`` with a config.json; a tiny_random model's own sizes; else ``conf/model/arch/<name>.json``.

- **GPU memory per GPU**, item by item, at each instant of an update (a player's weights gathered, the no-grad
  passes, forward, backward, optimizer step, the entropy bank, generation); the peak is the largest instant.
- **Host RAM per node**, for the ranks on that node (``--gpus`` of them; a run over ``--nodes`` has as many on
  each), at start-up (the backbone read on the host) and during an update.
- **Disk**: one checkpoint, the run's peak and what a finished run keeps, replayed from the save cadence
  (:func:`unifiedplayers.schedule.save_due`), in the run directory that the nodes share (counted once); and the
  idle players' state parked in ``trainer.offload_dir``, each node its own ranks'.
- **Compute**: tokens, sandbox calls and FLOPs per update (:mod:`unifiedplayers.trainer.flops` conventions), and
  GPU-hours per seed at a stated utilisation.

Every figure is an estimate from shapes and settings; :attr:`Plan.assumptions` says which. :func:`check_fits`
refuses at start-up a run whose plan exceeds the node it is on, on every node (``capacity.check=false`` turns it off).
Runs started together on one node each see only their own plan at start-up; ``--runs N`` or ``--members FILE``
checks their sum (:mod:`.concurrent`, ``experiments/dp8_single_gpu_runs.sh``).

One module per concern, in the order a plan is made: ``units`` (byte units, the one number formatter), ``arch`` (the
backbone's shapes), ``hardware`` (the machine, and this process's read from ``/proc`` and the disks), ``workload``
(the settings read once, each player's mini-batch and a phase's generation calls), ``memory`` (device and host RAM,
item by item), ``disk``, ``compute``, ``run_plan`` (:func:`plan`), ``fits`` (:func:`check_fits`), ``concurrent`` (runs
started together on one node) and ``report`` (the printed plan and the command line). The names callers use are
re-exported here.
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
