"""Decoding and mixed-batch serving: the decoding settings, repetition control and the plain generate every method
shares (generation), a decode request as data (rows: DecodeRow and the Steer protocol a method implements to
steer its rows), the runner that decodes rows of any method, person and adapter in one generate (runner), every
row with its own LoRA (row_lora), the cross-request batching window (scheduler) and the model's lock, which lets a
waiting person in before background work (model_lock). The runner knows no method.

May import: personalize.lm and the shared top-level modules.
"""
