// Uses //comm from another workspace: an all-reduce over two thread ranks.
#include <thread>

#include "comm/comm.h"
#include "comm/grid.h"
#include "comm/local/communicator.h"
#include "gtest/gtest.h"

TEST(EmbedTest, CommAllReduceWorksFromAnotherWorkspace) {
  auto world = loom::comm::local::CreateWorld(2);
  ASSERT_TRUE(world.ok()) << world.status();
  float results[2] = {0, 0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto t = loom::core::Tensor::Zeros(loom::core::Shape{1}, loom::core::DType::kF32);
      t->data<float>()[0] = r + 1.0f;
      EXPECT_TRUE((*world)[r]->AllReduce(*t, loom::comm::ReduceOp::kSum)->Wait().ok());
      results[r] = t->data<float>()[0];
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[0], 3.0f);
  EXPECT_EQ(results[1], 3.0f);
  auto grid = loom::comm::Grid::Make(8, 2, 2);
  ASSERT_TRUE(grid.ok());
  EXPECT_EQ(grid->dp(), 2);
}
