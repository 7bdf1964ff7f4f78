"""Static catalogs: architecture presets (published tensor shapes), llama.cpp's quantization tables and
rules, the runtimes umemc knows, the GGUF magic. Bottom of the package: the stack language, the
estimator and the compiler all read these, and these import nothing of umemc."""
