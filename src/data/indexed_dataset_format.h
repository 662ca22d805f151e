/* indexed_dataset_format.h: constants of the MMIDIDX .idx layout shared by
 * the reader and the writer, and dtype helpers (see indexed_dataset.h). */
#ifndef MT_DATA_INDEXED_DATASET_FORMAT_H
#define MT_DATA_INDEXED_DATASET_FORMAT_H

#define IDX_MAGIC "MMIDIDX\0\0"
#define IDX_MAGIC_BYTES 9
#define IDX_VERSION 1
/* magic (9) + u64 version (8) + u8 dtype (1) + u64 sequences (8) + u64 documents (8) */
#define IDX_HEADER_BYTES 34

/* Bytes per token of a dtype code (0 for an unknown code). */
int indexed_dtype_size(int dtype_code);
/* "uint16", "int32", ...; "unknown" for a bad code. */
const char *indexed_dtype_name(int dtype_code);

#endif
