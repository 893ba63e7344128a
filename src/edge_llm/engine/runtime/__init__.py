"""The model runtime behind one interface: llama.cpp, chat template, sampling, threads."""
