/* emu_streams.h: the emulator's stream queues (emu_streams.c): work enqueued on a stream runs now
 * (EMU_STREAMS=eager, the default) or when the program makes the stream run it (lazy, lazy-first). Used by the
 * runtime, cuBLAS and NCCL stand-ins (emu_runtime.c, emu_nccl.c) and by kernel launches (emu_device.h). */
#ifndef EMU_STREAMS_H
#define EMU_STREAMS_H
#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The racecheck build (make gpu-emu-tsan-build: the kernels, the runtime and this under ThreadSanitizer,
 * emu_exec.cpp without it, with EMU_TSAN): EMU_UNCHECKED_BEGIN/END bracket what the GPU has no memory for: the
 * emulator's own traffic between lanes (the warp exchange's slots, registers on a GPU), its bookkeeping (stream
 * queues, records, vectors), and the poison of a fresh block's shared memory. Elsewhere they do nothing. */
#if defined(__SANITIZE_THREAD__) || defined(EMU_TSAN)
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define EMU_UNCHECKED_BEGIN() __tsan_ignore_thread_begin()
#define EMU_UNCHECKED_END() __tsan_ignore_thread_end()
#else
#define EMU_UNCHECKED_BEGIN() ((void)0)
#define EMU_UNCHECKED_END() ((void)0)
#endif

typedef void (*EmuWorkFn)(void *ctx);

/* Enqueues run(ctx) on s (0: the thread's legacy default stream); drop(ctx), if given, runs after it. */
void emu_stream_submit(cudaStream_t s, EmuWorkFn run, EmuWorkFn drop, void *ctx);
/* Runs all of s's queued work (and what it waits for on other streams). */
void emu_stream_drain(cudaStream_t s);
/* Runs the queued work of every stream of this host thread. */
void emu_streams_drain_all(void);

#ifdef __cplusplus
}
#endif
#endif
