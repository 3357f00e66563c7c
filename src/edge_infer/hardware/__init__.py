"""What this machine can run: the CPU capability model and the kernel each option maps to (torch-free)."""
