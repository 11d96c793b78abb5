"""The closed world: universe (vocabulary, buckets, Spec), regions, bitboards, the sampler and
its batched generation, the ``Scene`` contract, question spelling, rendering, verification and
dataset statistics. Imports only ``mmx_base``."""
