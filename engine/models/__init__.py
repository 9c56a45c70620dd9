"""Which weights: model references, their shapes and sizes, what they can make, the self-test models."""
