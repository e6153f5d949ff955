"""The boot-time benchmark: real QEMU boots under the thesis' scenarios, per boot policy."""
