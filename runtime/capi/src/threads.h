// runtime/threads.py configure_threads in C++: how many CPU threads TVM's kernels run on.
//
// Why: TVM sizes its CPU pool as hardware_concurrency / 2 on x86 unless told, assuming two
// hyper-threads per core; on a VM or a phone without SMT that halves the machine (a 2-vCPU
// EPYC: one thread, Qwen2.5-1.5B q4 plain decode 26 tok/s where two threads give 37). So
// before the first kernel runs, spc_model_load sets TVM_NUM_THREADS to the physical cores
// this process may run on, unless the app chose TVM_NUM_THREADS or OMP_NUM_THREADS itself.
#ifndef SPECCOMPILE_CAPI_THREADS_H_
#define SPECCOMPILE_CAPI_THREADS_H_

namespace spc {

// Distinct (package, core) pairs among the CPUs this process may use (threads.py physical_cores).
int PhysicalCores();
// The count the app chose through TVM_NUM_THREADS or OMP_NUM_THREADS, or -1 (user_threads).
int UserThreads();
// Set TVM_NUM_THREADS unless the app did; returns the count in effect (configure_threads).
int ConfigureThreads();

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_THREADS_H_
