"""Drafters: one class per kind, all speaking the :class:`~decoder.drafters.base.Drafter` protocol."""

from decoder.drafters.base import Drafter, Proposal, drafter_label
from decoder.drafters.model import ModelDrafter
from decoder.drafters.ngram import NgramDrafter

__all__ = ["Drafter", "ModelDrafter", "NgramDrafter", "Proposal", "drafter_label"]
