/* version.h: the megatrain version string. */
#ifndef MT_VERSION_H
#define MT_VERSION_H
#define MEGATRAIN_VERSION "0.1.0"
#endif
