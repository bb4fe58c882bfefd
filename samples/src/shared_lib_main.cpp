// An app whose kernels all live in a shared library, as real applications keep them
// (libggml-cuda.so, libtorch_cuda.so): this executable has no GPU code of its own.
int run_kernels(void);

int main() { return run_kernels(); }
