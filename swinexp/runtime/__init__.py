"""The process runtime: MindSpore context and seeds, msrun launch, signals."""
