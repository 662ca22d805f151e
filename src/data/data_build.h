/* data_build.h: `megatrain data build`: text or JSONL -> Megatron indexed dataset. */
#ifndef MT_DATA_DATA_BUILD_H
#define MT_DATA_DATA_BUILD_H

#include <stdint.h>

/* The dtype code (indexed_dataset.h) of a dataset of ids below num_ids: uint16 under 65500 ids, int32 from
 * 65500 on, as megatron-core's DType.optimal_dtype (the legacy __best_fitting_dtype) chooses
 * (tests/fixtures/megatron/indexed.txt). */
int data_build_token_dtype(int64_t num_ids);

/* argv after "data build". Returns the process exit status. */
int data_build_main(int argc, char **argv);

#endif
