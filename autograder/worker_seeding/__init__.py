"""Checks for notebook 04: generators copied into every DataLoader worker.

A Dataset that builds a ``torch.Generator`` or a NumPy ``default_rng`` in
``__init__`` hands every worker a copy of the same generator: by ``fork`` (the
child inherits the parent's memory) or by pickling (``spawn``). PyTorch reseeds
the *global* RNGs in each worker, never generator objects a Dataset holds. The
checks run the learner's code in real worker processes (num_workers >= 2), read
back which worker drew which values, and compare the streams across workers,
across epochs and across two loaders built with the same seed. Every item must
carry a new draw (a generator made anew per item from one seed repeats it), and no
two generators of the workers may be one stream: seeded with ``torch.initial_seed()``
itself, a ``torch.Generator`` draws what the worker's global torch RNG draws, and
``np.random.seed(torch.initial_seed() % 2**32)`` makes NumPy's global RNG draw the same
raw words too (``tag_with_next_words`` reads every stream's next words in the worker).

Graded mode. The workers must be forked where the learner's ``seed_worker`` and
``LazyNoisyDataset`` live, so the loader runs in a probe (``probe_worker_streams``):
in the sandbox it returns the rows each worker drew, as tensors, and the check
judges them in the grading process. In the learner's kernel the probes run right there.

Start method. Workers are forked where the OS offers ``fork`` (Linux, macOS): it
is fast, and a worker sees functions and classes defined in notebook cells. Under
``spawn`` (Windows; or forced with WORKBOOK_WORKER_START=spawn) or ``forkserver`` (Linux's
default from Python 3.14; the notebook's 3.2 runs it) a worker is a new
interpreter that can only import objects from modules, so a function or class
defined in a notebook cell cannot be loaded there. ``portable`` then ships such an
object by value (its compiled code and the module-level names it uses) and the
worker rebuilds it; a dataset *instance* still travels by pickling, exactly as
spawn does it, so a generator built in ``__init__`` arrives as a copy.

The modules: ``loaders`` (the start method, the datasets, the loader runs and the probes),
``expectations`` (the remembered runs and what the checks of both exercises expect of the streams),
``seed_worker`` and ``lazy_dataset`` (the checks of each exercise). Notebooks 03 and 04, their test cells
and the forkserver's preload (``autograder.worker_seeding``) import every name from here: those never move.
"""

from .lazy_dataset import (check_LazyNoisyDataset_epochs, check_LazyNoisyDataset_peek,  # noqa: F401
                           check_LazyNoisyDataset_reproducible, check_LazyNoisyDataset_workers)
from .loaders import (AugmentedSamples, GlobalRngDataset, NoisyDataset, TorchAndNumpyAugmentations,  # noqa: F401
                      WorkerFailed, default_start_method, documented_seed_worker, probe_first_item, probe_peek_then_streams, probe_worker_streams,
                      tag_with_next_words, tag_with_worker_id, worker_streams, worker_streams_and_next_words)
from .seed_worker import (check_seed_worker_epochs, check_seed_worker_independent,  # noqa: F401
                          check_seed_worker_reproducible, check_seed_worker_workers)
