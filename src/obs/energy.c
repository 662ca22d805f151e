/* energy.c: NVML's energy counter through dlopen (see energy.h). The few
 * NVML entry points are declared here by their C signatures; no NVML header
 * or library is needed to build. */
#include "energy.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "../core/timer.h"

enum { NVML_OK = 0 };

bool energy_meter_open(EnergyMeter *meter, const char *pci_bus_id, char *why, int why_len) {
    memset(meter, 0, sizeof *meter);
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, (size_t)why_len, "NVML (libnvidia-ml.so.1) is not installed");
        return false;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_bus)(const char *, void **) = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    meter->total_energy = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    meter->shutdown = (int (*)(void))dlsym(lib, "nvmlShutdown");
    int rc = -1;
    if (!init || !by_bus || !meter->total_energy || !meter->shutdown) {
        snprintf(why, (size_t)why_len, "NVML lacks the energy functions");
    } else if ((rc = init()) != NVML_OK) {
        snprintf(why, (size_t)why_len, "nvmlInit failed (NVML error %d)", rc);
    } else if ((rc = by_bus(pci_bus_id, &meter->device)) != NVML_OK) {
        snprintf(why, (size_t)why_len, "NVML does not know the GPU at %s (NVML error %d)", pci_bus_id, rc);
        meter->shutdown();
    } else if ((rc = meter->total_energy(meter->device, &meter->last_mj)) != NVML_OK) {
        snprintf(why, (size_t)why_len, "the GPU at %s has no energy counter (NVML error %d)", pci_bus_id, rc);
        meter->shutdown();
    } else {
        meter->lib = lib;
        meter->last_time = mt_now();
        return true;
    }
    dlclose(lib);
    memset(meter, 0, sizeof *meter);
    return false;
}

bool energy_meter_read(EnergyMeter *meter, double *joules, double *watts) {
    if (!meter->lib) return false;
    unsigned long long now_mj = 0;
    if (meter->total_energy(meter->device, &now_mj) != NVML_OK || now_mj < meter->last_mj) return false;
    const double now = mt_now();
    *joules = (double)(now_mj - meter->last_mj) / 1000.0;
    *watts = now > meter->last_time ? *joules / (now - meter->last_time) : 0.0;
    meter->last_mj = now_mj;
    meter->last_time = now;
    return true;
}

void energy_meter_close(EnergyMeter *meter) {
    if (!meter->lib) return;
    meter->shutdown();
    dlclose(meter->lib);
    memset(meter, 0, sizeof *meter);
}
