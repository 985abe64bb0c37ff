/* Peer for `bench allreduce`: OpenMPI's MPI_Allreduce, timed the way bench
 * times ours. Args: SIZE:ITERS pairs. Prints one JSON line per size from each rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int a = 1; a < argc; a++) {
        long size, iters;
        sscanf(argv[a], "%ld:%ld", &size, &iters);
        long n = size / 4;
        float *in = malloc(size), *out = malloc(size);
        for (long i = 0; i < n; i++) in[i] = 1.0f;
        long warm = iters / 10 < 2 ? 2 : iters / 10;
        for (long i = 0; i < warm; i++) MPI_Allreduce(in, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++) MPI_Allreduce(in, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double elapsed = MPI_Wtime() - t0;
        printf("{\"rank\": %d, \"bytes\": %ld, \"iters\": %ld, \"seconds\": %.9f}\n", rank, size, iters, elapsed);
        fflush(stdout);
        free(in);
        free(out);
    }
    MPI_Finalize();
    return 0;
}
