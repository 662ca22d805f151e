/* cuda_device.h: what the CUDA build can see of the machine: GPUs (name,
 * compute capability, memory, SMs) and the runtime, driver, cuBLASLt and NCCL
 * versions it runs with. Host C11; compiled only with `make CUDA=1`. */
#ifndef MT_BACKEND_CUDA_DEVICE_H
#define MT_BACKEND_CUDA_DEVICE_H

#include <stddef.h>

/* Write a human-readable description (one line of library versions, then
 * one line per GPU) into buf. Returns the number of GPUs found (>= 1), or
 * -1 when none can be used, with the reason in buf (e.g. no driver). */
int cuda_describe_devices(char *buf, size_t n);

/* Number of usable GPUs (0 when there is no driver or no device). */
int cuda_device_count(void);

#endif
