"""Model families as specs: the one place that knows which FeedbackLM subclass a model argument holds and how to
build, load (to decode, serve or train on), tokenize and save it. Training, checkpoints, serving, evaluation and the
studies ask a :class:`FamilySpec` and never name a family or test a prefix.

Adding a model family is one spec here: write its FeedbackLM subclass (answering :mod:`fullband.model.family`'s
interface: its files, cache type, parameter roles, and ``from_source`` if it is built from something outside
fullband) in a module of its own, add a :class:`FamilySpec` naming it by ``"module:Class"`` to
:data:`~fullband.families.table.FAMILIES` (its marker file, its source prefix, its pip extra, its Auto-classes
module), and, if it is built from a source, its options section to
:class:`~fullband.families.table.FamilyOptions` (that is ``fullband train --<section>.<key>``).

The spec and the table are torch-free (the command line reads the options sections before importing torch); the
loading functions (:mod:`fullband.families.loading`: ``load_any``, ``init_from``, ...) import torch on first use.
"""

from fullband.families.spec import FamilySpec
from fullband.families.table import (
    DEFAULT,
    FAMILIES,
    NATIVE,
    RETROFIT,
    FamilyOptions,
    checkpoint_dir,
    family_named,
    family_of,
    family_of_argument,
    family_of_files,
    source_family,
    source_help,
)
from fullband.integrations import lazy_exports

_LOADING = {name: "fullband.families.loading" for name in
            ("AnyLM", "InitFrom", "init_from", "load_any", "load_tokenizer_of")}
__all__ = ["DEFAULT", "FAMILIES", "NATIVE", "RETROFIT", "FamilyOptions", "FamilySpec", "checkpoint_dir",
           "family_named", "family_of", "family_of_argument", "family_of_files", "source_family", "source_help",
           *_LOADING]

__getattr__ = lazy_exports(__name__, _LOADING)
