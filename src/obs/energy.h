/* energy.h: a GPU's energy counter through NVML, loaded at run time with
 * dlopen (libnvidia-ml.so.1 comes with the NVIDIA driver), so the binary runs
 * where NVML is absent and simply reports no energy there.
 * NVML's counter is the board's energy in millijoules since the driver
 * loaded (Volta and newer), refreshed every 20-100 ms: read it over logging
 * intervals, not single kernels. */
#ifndef MT_OBS_ENERGY_H
#define MT_OBS_ENERGY_H

#include <stdbool.h>

typedef struct EnergyMeter {
    void *lib;                 /* dlopen handle; NULL when NVML is not there */
    void *device;              /* nvmlDevice_t */
    int (*total_energy)(void *device, unsigned long long *millijoules);
    int (*shutdown)(void);
    unsigned long long last_mj;
    double last_time;          /* mt_now() at last_mj */
} EnergyMeter;

/* Open NVML for the GPU at `pci_bus_id` ("0000:3B:00.0", as CUDA reports it).
 * Returns false, with the reason in why (for one log line), when NVML or the
 * GPU's energy counter is not available; the meter then stays closed. */
bool energy_meter_open(EnergyMeter *meter, const char *pci_bus_id, char *why, int why_len);
/* Joules used since the last read (or since open) and the mean power over
 * that time in watts. false when closed or the read fails. */
bool energy_meter_read(EnergyMeter *meter, double *joules, double *watts);
void energy_meter_close(EnergyMeter *meter);

#endif
