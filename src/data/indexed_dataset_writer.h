/* indexed_dataset_writer.h: additions to the writer in indexed_dataset.h.
 *
 * The writer streams tokens to a temporary PREFIX.bin.tmp.PID and, at finish,
 * writes PREFIX.idx.tmp.PID, fsyncs both and renames them into place (.bin
 * first, .idx last), so an interrupted build never leaves a half dataset
 * under PREFIX. An existing PREFIX.bin or PREFIX.idx is not replaced (finish
 * fails) unless overwrite is set.
 */
#ifndef MT_DATA_INDEXED_DATASET_WRITER_H
#define MT_DATA_INDEXED_DATASET_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "indexed_dataset.h"

/* Let finish replace an existing dataset under the prefix (default: refuse). */
void indexed_dataset_writer_set_overwrite(IndexedDatasetWriter *w, bool overwrite);

/* finish in two halves, for a dataset written as several (tokens and their loss mask), so that all the slow
 * and failing work (flushing, fsync, the index) is done for each before any is put in place:
 * seal closes and fsyncs PREFIX.bin's temporary and writes and fsyncs the .idx's; place renames them into
 * place as finish does and frees w. Each returns 0, or -1 with err, having aborted w. */
int indexed_dataset_writer_seal(IndexedDatasetWriter *w, char *err, size_t errlen);
int indexed_dataset_writer_place(IndexedDatasetWriter *w, char *err, size_t errlen);

/* Drop everything written so far (removes the temporary files) and free w. */
void indexed_dataset_writer_abort(IndexedDatasetWriter *w);

/* The message of the last failed add_document (empty when none failed). */
const char *indexed_dataset_writer_error(const IndexedDatasetWriter *w);

/* Documents and tokens added so far. */
int64_t indexed_dataset_writer_documents(const IndexedDatasetWriter *w);
int64_t indexed_dataset_writer_tokens(const IndexedDatasetWriter *w);

#endif
