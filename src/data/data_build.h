/* data_build.h: `megatrain data build`: text or JSONL -> Megatron indexed dataset. */
#ifndef MT_DATA_DATA_BUILD_H
#define MT_DATA_DATA_BUILD_H

/* argv after "data build". Returns the process exit status. */
int data_build_main(int argc, char **argv);

#endif
