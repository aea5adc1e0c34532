"""Model adapters: one per model family, behind one interface."""
