"""``draftwatch demo``: the whole product on real models, in one command."""
