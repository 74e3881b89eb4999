"""The language model and the CPU it runs on: loading (models), one tokenisation (tokens), whole characters in
byte-level outputs (utf8), hidden-state capture (features), a batch's shared prompt prefix read once (prefix), oneDNN
linear layers (onednn) and the serving process's threads and heap (cpu_threads).

May import: the standard library and third-party packages only (the bottom layer; nothing of personalize).
"""
