/* pipeline_cuda.h: the CUDA model as a pipeline stage (pipeline_cuda.c);
 * CUDA builds only. */
#ifndef MT_TRAIN_PIPELINE_CUDA_H
#define MT_TRAIN_PIPELINE_CUDA_H

#include "pipeline.h"

extern const PipelineStageOps pipeline_cuda_ops;

#endif
