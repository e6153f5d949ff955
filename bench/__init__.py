"""The benchmarks, a project of their own beside the product (bench/README.md)."""
